"""Render deploy/kubernetes with the real `kubectl kustomize`, and the checks every test shares:
the hygiene list of a workload (:func:`hygiene_problems`) and the secret scan (:func:`leaks`).

Each check returns messages naming the object and the missing field, so a table-driven test
shows exactly what is wrong, and a mutated copy of a good object shows the check can fail.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("prometheus-mode-postgres", "trial-sqlite")
RENDERED = (*(f"overlays/{o}" for o in OVERLAYS), "monitors")  # every kustomization shipped
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod")

Obj = dict[str, Any]


@functools.cache
def render(rel: str) -> tuple[Obj, ...]:
    """The objects ``kubectl kustomize deploy/kubernetes/<rel>`` prints (cached per run)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # CI and the dev machine have it; say so rather than pass silently
        pytest.skip("kubectl not on PATH (kustomize 5 is built into kubectl >= 1.27)")
    proc = subprocess.run(
        [kubectl, "kustomize", str(K8S / rel)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def name_of(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def pod_spec(obj: Obj) -> Obj | None:
    """The pod spec of a workload (None for other kinds)."""
    if obj["kind"] == "Pod":
        return dict(obj["spec"])
    if obj["kind"] == "CronJob":
        return dict(obj["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    if obj["kind"] in WORKLOADS:
        return dict(obj["spec"]["template"]["spec"])
    return None


def containers(spec: Obj) -> Iterator[tuple[str, Obj]]:
    """("container NAME" | "initContainer NAME", container) of a pod spec."""
    for key, what in (("initContainers", "initContainer"), ("containers", "container")):
        for c in spec.get(key) or []:
            yield f"{what} {c['name']}", c


def _sc(obj: Obj | None) -> Obj:
    return dict((obj or {}).get("securityContext") or {})


def _container_problems(spec: Obj, label: str, c: Obj, init: bool) -> list[str]:
    pod, sc, out = _sc(spec), _sc(c), []
    if sc.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
        out.append(f"{label}: runAsNonRoot is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"{label}: securityContext.allowPrivilegeEscalation is not false")
    if sc.get("readOnlyRootFilesystem") is not True:
        out.append(f"{label}: securityContext.readOnlyRootFilesystem is not true")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        out.append(f"{label}: securityContext.capabilities.drop lacks ALL")
    seccomp = sc.get("seccompProfile") or pod.get("seccompProfile") or {}
    if seccomp.get("type") != "RuntimeDefault":
        out.append(f"{label}: seccompProfile is not RuntimeDefault")
    res = c.get("resources") or {}
    for part in ("requests", "limits"):
        for what in ("cpu", "memory"):
            if what not in (res.get(part) or {}):
                out.append(f"{label}: resources.{part}.{what} is not set")
    image = str(c.get("image", ""))
    tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
    if not tag or tag == "latest":
        out.append(f"{label}: image {image!r} is not pinned to a tag")
    emptydirs = {v["name"] for v in spec.get("volumes") or [] if "emptyDir" in v}
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
    if mounts.get("/tmp") not in emptydirs:
        out.append(f"{label}: /tmp is not an emptyDir (the root filesystem is read-only)")
    if not init:
        if "readinessProbe" not in c:
            out.append(f"{label}: readinessProbe is not set")
        if c.get("ports") and "livenessProbe" not in c:
            out.append(f"{label}: serves a port but livenessProbe is not set")
    return out


def hygiene_problems(obj: Obj) -> list[str]:
    """What the workload ``obj`` lacks of the hygiene list (issue 26), one message each."""
    spec = pod_spec(obj)
    if spec is None:
        return []
    where = name_of(obj)
    out = []
    if spec.get("automountServiceAccountToken") is not False:
        out.append(f"{where}: automountServiceAccountToken is not false")
    if not spec.get("serviceAccountName"):
        out.append(f"{where}: serviceAccountName is not set")
    for label, c in containers(spec):
        init = label.startswith("initContainer")
        out += [f"{where} {m}" for m in _container_problems(spec, label, c, init)]
    return out


# A credential in a URL (scheme://user:password@host), a password/token field with a literal
# value, or a Secret object at all: the manifests only reference Secrets by name.
_LEAKS = (
    re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@\"']+:[^/\s@\"']+@", re.IGNORECASE),
    re.compile(r"\b(password|passwd|secret|token|api[_-]?key)[ \t]*[:=][ \t]*[^\s{\[]\S{5,}", re.I),
)


def leaks(obj: Obj) -> list[str]:
    """Literal credentials in ``obj`` (its YAML text), one message each."""
    if obj["kind"] == "Secret":
        return [f"{name_of(obj)}: a Secret is in the manifests"]
    text = yaml.safe_dump(obj, width=1 << 16)
    return [f"{name_of(obj)}: {m.group(0)!r}" for rx in _LEAKS for m in rx.finditer(text)]
