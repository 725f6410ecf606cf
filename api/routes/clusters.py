"""GET /v1/clusters and GET /v1/clusters/{cluster}/engines: what the store has registered."""

from __future__ import annotations

from collections import Counter

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from api.deps import Cluster, StoreDep, require_read
from api.error_responses import responses
from api.respond import json_ok
from api.schemas import ClustersOut, EnginesOut

router = APIRouter(prefix="/v1", tags=["clusters"], dependencies=[Depends(require_read)])


@router.get("/clusters", response_model=ClustersOut, responses=responses(400, 401, 503))
def clusters(store: StoreDep) -> Response:
    """Every cluster the store knows, with how many engines and targets it registers."""
    engines = Counter(e.cluster for e in store.engines())
    targets = Counter(t.cluster for t in store.targets())
    out = [
        {"name": name, "engines": engines[name], "targets": targets[name]}
        for name in store.clusters()
    ]
    return json_ok({"clusters": out})


@router.get(
    "/clusters/{cluster}/engines",
    response_model=EnginesOut,
    responses=responses(400, 401, 404, 422, 503),
)
def engines(cluster: Cluster, store: StoreDep) -> Response:
    """The cluster's engines: model, GPU, TP, offload mode and facts."""
    out = [
        {
            "source": e.source,
            "model": e.model,
            "gpu": e.gpu,
            "hbm_gb": e.hbm_gb,
            "tensor_parallel": e.tensor_parallel,
            "offload": e.offload,
            "facts": dict(e.facts),
            "changes": [
                {"at": c.at, "offload": c.offload, "facts": dict(c.facts)} for c in e.changes
            ],
        }
        for e in store.engines(cluster)
    ]
    return json_ok({"cluster": cluster, "engines": out})
