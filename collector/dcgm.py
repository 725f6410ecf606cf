"""What NVIDIA's DCGM exporter says about an engine's GPUs, from the same Prometheus.

vLLM exports neither the GPU type nor how many GPUs an engine spans; dcgm-exporter's
per-GPU series (catalog.DCGM_GPU_FAMILY) carry ``modelName`` and the consumer pod. An engine
is joined to its GPUs by pod (GPU model and count: its TP) or else by host (the model only,
when the node's GPUs are all of one model).

Design: collector/DESIGN.md#dcgm
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["GpuFacts", "engine_gpus", "gpu_slug", "host_of"]


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """An engine's GPUs as DCGM shows them; ``gpus`` None: not known (host join)."""

    gpu: str
    gpus: int | None
    basis: str


def gpu_slug(model_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` → ``nvidia-h100-80gb-hbm3`` (the hardware catalogue's alias
    spelling, planner/domain/data/hardware.yaml)."""
    return re.sub(r"[^a-z0-9.]+", "-", model_name.strip().lower()).strip("-")


def host_of(instance: str) -> str:
    """The host part of ``host:port`` (``[v6]:port`` too); the whole string without a port."""
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    host, sep, port = instance.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else instance


def _pod(labels: Mapping[str, str], *, exported: bool) -> tuple[str, str] | None:
    prefix = "exported_" if exported else ""
    pod = labels.get(f"{prefix}pod") or (labels.get("pod") if exported else None)
    if not pod:
        return None
    ns = labels.get(f"{prefix}namespace") or (labels.get("namespace", "") if exported else "")
    return ns, pod


def engine_gpus(
    engines: Mapping[str, Mapping[str, str]], series: Sequence[Mapping[str, str]]
) -> dict[str, GpuFacts]:
    """source -> its GPUs, for the engines (source -> labels: ``instance``, ``pod``,
    ``namespace``) that DCGM's ``series`` (label sets) can be joined to (DESIGN.md#dcgm)."""
    by_pod: dict[tuple[str, str], dict[str, set[str]]] = {}
    by_host: dict[str, set[str]] = {}
    for s in series:
        model = s.get("modelName", "")
        if not model:
            continue
        device = f"{s.get('Hostname', '')}/{s.get('UUID') or s.get('gpu', '')}"
        pod = _pod(s, exported=True)
        if pod is not None:
            by_pod.setdefault(pod, {}).setdefault(model, set()).add(device)
        for host in {host_of(s.get("instance", "")), s.get("Hostname", "")} - {""}:
            by_host.setdefault(host, set()).add(model)
    out: dict[str, GpuFacts] = {}
    for source, labels in engines.items():
        pod = _pod(labels, exported=False)
        models = by_pod.get(pod) if pod is not None else None
        if pod is not None and models and len(models) == 1:
            ((model, devices),) = models.items()
            where = f"{pod[0]}/{pod[1]}" if pod[0] else pod[1]
            out[source] = GpuFacts(gpu_slug(model), len(devices),
                                   f"dcgm: {len(devices)} x {model} on pod {where}")  # fmt: skip
            continue
        host = host_of(labels.get("instance", source))
        on_host = by_host.get(host, set())
        if len(on_host) == 1:
            (model,) = on_host
            out[source] = GpuFacts(gpu_slug(model), None, f"dcgm: {model} on host {host}")
    return out
