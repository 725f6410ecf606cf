"""deploy/kubernetes rendered by the real `kubectl kustomize`: every object validates against
the Kubernetes OpenAPI schema (kubernetes-validate, Kubernetes 1.32, strict: unknown fields
fail) or its Prometheus Operator CRD (tests/kubernetes/crds, v0.93.0), every workload meets
the hygiene list, and no credential is written in any object."""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from dashboards.config import DEFAULT
from tests.kubernetes.render import (
    OVERLAYS,
    RENDERED,
    ROOT,
    Obj,
    containers,
    hygiene_problems,
    leaks,
    name_of,
    pod_spec,
    render,
)

K8S_VERSION = "1.32"  # the oldest minor still in upstream support when written; kubectl's
CRDS = Path(__file__).parent / "crds"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _objects() -> list[tuple[str, Obj]]:
    return [(rel, o) for rel in RENDERED for o in render(rel)]


def _ids(pairs: list[tuple[str, Obj]]) -> list[str]:
    return [f"{rel.rsplit('/', 1)[-1]}:{name_of(o)}" for rel, o in pairs]


@cache
def _crd_schemas() -> dict[tuple[str, str], Obj]:
    """(apiVersion, kind) -> openAPIV3Schema of each vendored CRD's served versions."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for v in crd["spec"]["versions"]:
            if v["served"]:
                key = (f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"])
                out[key] = v["schema"]["openAPIV3Schema"]
    return out


def _pruned(value: Any, schema: Obj, path: str) -> list[str]:
    """Fields the API server would drop silently (not in the structural schema): typos."""
    if isinstance(value, dict) and not schema.get("x-kubernetes-preserve-unknown-fields"):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        out = []
        for k, v in value.items():
            if props is not None and k in props:
                out += _pruned(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                out += _pruned(v, extra, f"{path}.{k}")
            elif props is not None:
                out.append(f"{path}.{k}")
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [p for i, v in enumerate(value) for p in _pruned(v, schema["items"], f"{path}[{i}]")]
    return []


def crd_errors(obj: Obj) -> list[str]:
    """Why ``obj`` does not validate against its vendored CRD's schema (empty: it does)."""
    schema = _crd_schemas()[(obj["apiVersion"], obj["kind"])]
    body = {k: v for k, v in obj.items() if k != "metadata"}  # metadata: the API's own
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(body)]
    return errors + [f"unknown field {p}" for p in _pruned(body, schema, "")]


def test_every_overlay_and_the_monitors_render() -> None:
    for rel in RENDERED:
        assert render(rel), rel
    assert {p.name for p in (ROOT / "deploy/kubernetes/overlays").iterdir()} == set(OVERLAYS)


@pytest.mark.parametrize(("rel", "obj"), _objects(), ids=_ids(_objects()))
def test_every_object_validates(rel: str, obj: Obj) -> None:
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        assert crd_errors(obj) == []
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_a_broken_object_fails_validation() -> None:
    deploy = copy.deepcopy(_find("overlays/prometheus-mode-postgres", "Deployment", "kvscope-api"))
    deploy["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deploy, K8S_VERSION, strict=True)
    monitor = copy.deepcopy(_find("overlays/prometheus-mode-postgres", "ServiceMonitor", "kvscope"))
    monitor["spec"]["endpoints"][0]["interval"] = "30 seconds"  # not a Prometheus duration
    monitor["spec"]["endpoints"][1]["prot"] = "http"  # a typo the API server would drop
    errors = crd_errors(monitor)
    assert (
        any("30 seconds" in e for e in errors) and "unknown field .spec.endpoints[1].prot" in errors
    )


def _find(rel: str, kind: str, name: str) -> Obj:
    (found,) = [o for o in render(rel) if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _workloads() -> list[tuple[str, Obj]]:
    return [(rel, o) for rel, o in _objects() if pod_spec(o) is not None]


@pytest.mark.parametrize(("rel", "obj"), _workloads(), ids=_ids(_workloads()))
def test_every_workload_meets_the_hygiene_list(rel: str, obj: Obj) -> None:
    assert hygiene_problems(obj) == []


def _set(path: str, value: Any) -> Callable[[Obj], None]:
    """A mutation: set ``path`` (dots; [n] for list items) of the API Deployment's pod."""

    def apply(obj: Obj) -> None:
        node: Any = obj["spec"]["template"]["spec"]
        keys = [int(k) if k.isdigit() else k for k in re.split(r"\.|\[|\]\.?", path) if k]
        for k in keys[:-1]:
            node = node[k]
        if value is None:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value

    return apply


API = "Deployment/kvscope-api container api"
MUTATIONS = [
    ("containers[0].securityContext.runAsNonRoot", False, f"{API}: runAsNonRoot is not true"),
    ("securityContext.runAsNonRoot", None, None),  # the container's own still holds
    ("containers[0].securityContext.readOnlyRootFilesystem", None,
     f"{API}: securityContext.readOnlyRootFilesystem is not true"),
    ("containers[0].securityContext.allowPrivilegeEscalation", True,
     f"{API}: securityContext.allowPrivilegeEscalation is not false"),
    ("containers[0].securityContext.capabilities.drop", ["NET_RAW"],
     f"{API}: securityContext.capabilities.drop lacks ALL"),
    ("containers[0].securityContext.seccompProfile.type", "Unconfined",
     f"{API}: seccompProfile is not RuntimeDefault"),
    ("containers[0].resources.limits", None, f"{API}: resources.limits.memory is not set"),
    ("containers[0].image", "kvscope:latest", f"{API}: image 'kvscope:latest' is not pinned"),
    ("containers[0].image", "registry:5000/kvscope", f"{API}: image 'registry:5000/kvscope'"),
    ("containers[0].livenessProbe", None, f"{API}: serves a port but livenessProbe is not set"),
    ("containers[0].readinessProbe", None, f"{API}: readinessProbe is not set"),
    ("volumes[0].emptyDir", None, f"{API}: /tmp is not an emptyDir"),
    ("automountServiceAccountToken", None,
     "Deployment/kvscope-api: automountServiceAccountToken is not false"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "value", "expected"), MUTATIONS)
def test_the_hygiene_check_catches_each_missing_field(
    path: str, value: Any, expected: str | None
) -> None:
    deploy = copy.deepcopy(_find("overlays/prometheus-mode-postgres", "Deployment", "kvscope-api"))
    if path == "volumes[0].emptyDir":
        deploy["spec"]["template"]["spec"]["volumes"][0] = {
            "name": "tmp",
            "hostPath": {"path": "/tmp"},
        }
    else:
        _set(path, value)(deploy)
    problems = hygiene_problems(deploy)
    if expected is None:
        assert problems == []
    else:
        assert any(p.startswith(expected) for p in problems), problems


@pytest.mark.parametrize(("rel", "obj"), _objects(), ids=_ids(_objects()))
def test_no_credential_is_written_in_any_object(rel: str, obj: Obj) -> None:
    assert leaks(obj) == []


@pytest.mark.parametrize(
    "literal",
    [
        "postgresql+psycopg://kvscope:hunter2hunter2@db:5432/kvscope",
        "postgresql://user:pass@db/kvscope",
        "password: s3cr3tpw",
    ],
)
def test_the_credential_scan_catches_a_literal(literal: str) -> None:
    deploy = copy.deepcopy(
        _find("overlays/prometheus-mode-postgres", "Deployment", "kvscope-planner")
    )
    deploy["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "KVSCOPE_DB", "value": literal}
    )
    assert leaks(deploy) != []
    assert leaks({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kvscope-store"}})


def test_store_url_and_token_come_from_secrets_by_reference() -> None:
    objs = render("overlays/prometheus-mode-postgres")
    for obj in objs:
        spec = pod_spec(obj)
        if spec is None:
            continue
        for label, c in containers(spec):
            env = {e["name"]: e for e in c.get("env") or []}
            assert env["KVSCOPE_DB"]["valueFrom"]["secretKeyRef"] == {
                "name": "kvscope-store", "key": "url"
            }, (name_of(obj), label)  # fmt: skip
            assert "KVSCOPE_API_TOKEN" not in env
    api = pod_spec(_find("overlays/prometheus-mode-postgres", "Deployment", "kvscope-api"))
    assert api is not None
    (token,) = [v for v in api["volumes"] if "secret" in v]
    assert token["secret"]["secretName"] == "kvscope-api-token"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_the_package_version(overlay: str) -> None:
    for obj in render(f"overlays/{overlay}"):
        spec = pod_spec(obj)
        for label, c in containers(spec or {}):
            assert c["image"] == f"kvscope:{VERSION}", (name_of(obj), label)


def test_service_names_are_the_jobs_the_generated_rules_select() -> None:
    """A ServiceMonitor's job label is the Service's name: kvscope-collector, kvscope-api."""
    jobs = {re.fullmatch(r'job="([^"]+)"', s).group(1)  # type: ignore[union-attr]
            for s in (DEFAULT.collector_selector, DEFAULT.planner_selector)}  # fmt: skip
    for overlay in OVERLAYS:
        objs = render(f"overlays/{overlay}")
        services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
        assert jobs <= set(services), overlay
        (monitor,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
        ports = {e["port"] for e in monitor["spec"]["endpoints"]}
        for job in jobs:
            assert {p["name"] for p in services[job]["spec"]["ports"]} & ports, job
            selected = _selected(objs, services[job]["spec"]["selector"])
            assert selected, f"{overlay}: Service {job} selects no pod"


def _selected(objs: tuple[Obj, ...], selector: dict[str, str]) -> list[str]:
    out = []
    for o in objs:
        if pod_spec(o) is not None:
            labels = o["spec"]["template"]["metadata"]["labels"]
            if selector.items() <= labels.items():
                out.append(name_of(o))
    return out


def test_lmcache_example_monitor_gives_the_job_the_rules_select() -> None:
    (pm,) = [o for o in render("monitors") if o["metadata"]["name"] == "lmcache-servers"]
    (relabel,) = pm["spec"]["podMetricsEndpoints"][0]["relabelings"]
    pattern = re.fullmatch(r'job=~"([^"]+)"', DEFAULT.lmcache_selector).group(1)  # type: ignore[union-attr]
    assert relabel["targetLabel"] == "job" and re.fullmatch(pattern, relabel["replacement"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_guard_the_store_and_the_api(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    policies = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "NetworkPolicy"}
    deny = policies["kvscope-default-deny"]
    assert deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny
    assert "egress" not in deny
    api = policies["kvscope-api"]
    (rule,) = api["ingress"]
    peers = [p["podSelector"]["matchLabels"] for p in rule["from"]]
    assert peers == [{"app.kubernetes.io/name": "prometheus"}, {"kvscope.io/api-client": "true"}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert _selected(objs, api["podSelector"]["matchLabels"]), "the API policy selects no pod"
    store = policies.get("kvscope-store-egress")
    if overlay == "trial-sqlite":
        assert store is None  # SQLite on the PVC: no network store
        return
    assert store is not None
    assert store["egress"] == [{"ports": [{"protocol": "TCP", "port": 5432}]}]
    clients = sorted(_selected(objs, store["podSelector"]["matchLabels"]))
    assert clients == [
        "Deployment/kvscope-api", "Deployment/kvscope-collector", "Deployment/kvscope-planner"
    ]  # fmt: skip


def test_pdb_where_replicas_allow_one() -> None:
    objs = render("overlays/prometheus-mode-postgres")
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    for o in objs:
        if o["kind"] != "Deployment":
            continue
        covered = [p for p in pdbs if p["spec"]["selector"]["matchLabels"].items()
                   <= o["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip
        if o["spec"]["replicas"] > 1:
            assert covered and covered[0]["spec"]["minAvailable"] < o["spec"]["replicas"]
        else:
            assert not covered, name_of(o)  # a PDB on one replica would block every drain
    trial = render("overlays/trial-sqlite")
    assert not [o for o in trial if o["kind"] == "PodDisruptionBudget"]
    (deploy,) = [o for o in trial if o["kind"] == "Deployment"]
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"]["type"] == "Recreate"
    spec = pod_spec(deploy)
    assert spec is not None
    (claim,) = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    pvc = [o for o in trial if o["kind"] == "PersistentVolumeClaim"]
    assert [p["metadata"]["name"] for p in pvc] == [claim["persistentVolumeClaim"]["claimName"]]
    for label, c in containers(spec):
        env = {e["name"]: e.get("value", "") for e in c.get("env") or []}
        assert env["KVSCOPE_DB"].startswith("sqlite:////var/lib/kvscope/data/"), label
        assert any(m["name"] == claim["name"] for m in c["volumeMounts"]), label


def test_service_account_mounts_no_token() -> None:
    for overlay in OVERLAYS:
        (sa,) = [o for o in render(f"overlays/{overlay}") if o["kind"] == "ServiceAccount"]
        assert sa["automountServiceAccountToken"] is False
