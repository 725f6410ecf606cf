"""Every path of the API against a real store (SQLite and PostgreSQL) holding a synthetic
cluster and its saved plans: the answers carry the store's own numbers."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.schemas import CpuTierOut
from core import kvscope_metrics as sm
from store.store import Store
from store.tables import SCHEMA_VERSION, PlanRecord
from tests.api.conftest import AUTH, CHEAP_WHATIF, CLUSTER, Filled, assert_error, settings_for
from tests.tierdoc import CANNOT, SECTION


def test_healthz_up_answers_ok(client: TestClient) -> None:
    resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.json() == {"status": "ok"}


def test_readyz_current_store_answers_ready(client: TestClient) -> None:
    resp = client.get("/readyz")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"status": "ready", "schema_version": SCHEMA_VERSION}


def test_clusters_filled_store_lists_cluster_with_counts(client: TestClient) -> None:
    resp = client.get("/v1/clusters")
    assert resp.status_code == 200
    assert resp.json() == {"clusters": [{"name": CLUSTER, "engines": 4, "targets": 1}]}


def test_engines_known_cluster_lists_registered_engines(
    client: TestClient, filled_app: tuple[object, Filled]
) -> None:
    _, filled = filled_app
    resp = client.get(f"/v1/clusters/{CLUSTER}/engines")
    assert resp.status_code == 200
    body = resp.json()
    assert [e["source"] for e in body["engines"]] == list(filled.sources)
    assert {e["offload"] for e in body["engines"]} == {"none", "native"}
    assert body["engines"][0]["facts"] == {"num_gpu_blocks": 28000, "block_size": 16}


def test_signals_latest_windows_match_store_values(
    client: TestClient, filled_app: tuple[object, Filled]
) -> None:
    _, filled = filled_app
    before = time.time()
    resp = client.get(f"/v1/clusters/{CLUSTER}/signals", params={"since": "3h"})
    after = time.time()
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["since_s"] == 3 * 3600
    engines = {e["source"]: e for e in body["engines"]}
    assert set(engines) == set(filled.sources)
    with Store(filled.url) as store:
        windows = store.read_windows(sources=[filled.sources[0]], signals=["kv_cache_usage_ratio"])
        tokens = store.read_windows(
            sources=[filled.sources[0]], signals=["prompt_tokens_total", "generation_tokens_total"]
        )
    last = max(windows, key=lambda w: w.start)
    one = engines[filled.sources[0]]
    kv = one["signals"]["kv_cache_usage_ratio"]
    assert kv["value"] == pytest.approx(last.mean)
    assert kv["stat"] == "mean" and kv["window_start"] == last.start
    latest_tokens = [w for w in tokens if w.start == max(t.start for t in tokens)]
    assert one["tokens_per_s"] == pytest.approx(sum(w.rate or 0.0 for w in latest_tokens))
    assert one["signals"]["preemptions_total"]["unit"] == "preemptions/s"
    assert one["signals"]["ttft_seconds"]["stat"] == "p90"
    assert one["offload"] in ("none", "native")
    # now − the end of the engine's latest window, taken between the request's two clocks
    end = max(sig["window_start"] + sig["window_s"] for sig in one["signals"].values())
    assert max(0.0, before - end) - 1e-6 <= one["age_s"] <= max(0.0, after - end) + 1e-6
    assert end == pytest.approx(last.start + last.length_s)


def test_signals_short_since_before_latest_window_lists_no_engine(
    client: TestClient, filled_app: tuple[object, Filled]
) -> None:
    _, filled = filled_app
    if time.time() - filled.window_until < 2:
        pytest.skip("the synthetic windows end too recently")
    resp = client.get(f"/v1/clusters/{CLUSTER}/signals", params={"since": "1s"})
    assert resp.status_code == 200 and resp.json()["engines"] == []


def test_plan_latest_returns_document_and_age(
    client: TestClient, filled_app: tuple[object, Filled]
) -> None:
    _, filled = filled_app
    resp = client.get(f"/v1/clusters/{CLUSTER}/plan")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"] == filled.latest_plan_id and body["group"] == ""
    assert 0 <= body["age_s"] < 3600
    assert body["document"]["decision"]["mode"] == body["mode"]
    assert set(body["document"]) >= {"happening", "decision", "fits", "forecast", "sizing"}
    score = body["document"]["decision"]["score"]
    assert body["headline"]["score"] == pytest.approx(score, abs=1e-3)  # the JSON rounds it


def test_plans_history_newest_first_with_headlines(
    client: TestClient, filled_app: tuple[object, Filled]
) -> None:
    _, filled = filled_app
    resp = client.get(f"/v1/clusters/{CLUSTER}/plans")
    assert resp.status_code == 200
    plans = resp.json()["plans"]
    assert [p["id"] for p in plans] == [filled.latest_plan_id, filled.old_plan_id]
    assert all("document" not in p and "score" in p["headline"] for p in plans)
    recent = client.get(f"/v1/clusters/{CLUSTER}/plans", params={"since": "10m"}).json()
    assert [p["id"] for p in recent["plans"]] == [filled.latest_plan_id]
    assert recent["since_s"] == 600


def test_forecast_latest_plan_section_returned(client: TestClient) -> None:
    plan = client.get(f"/v1/clusters/{CLUSTER}/plan").json()
    resp = client.get(f"/v1/clusters/{CLUSTER}/forecast")
    assert resp.status_code == 200
    body = resp.json()
    assert body["plan_id"] == plan["id"]
    assert body["forecast"] == plan["document"]["forecast"]
    assert body["forecast"]["kv_demand"]["points"]


def test_offload_latest_plan_section_returned_with_units_per_mode(client: TestClient) -> None:
    plan = client.get(f"/v1/clusters/{CLUSTER}/plan").json()
    resp = client.get(f"/v1/clusters/{CLUSTER}/offload")
    assert resp.status_code == 200
    body = resp.json()
    assert body["plan_id"] == plan["id"]
    assert body["offload"] == plan["document"]["offload"]
    for mode in ("native", "lmcache"):
        entry = body["offload"]["modes"][mode]
        assert {"units", "today", "capacity", "bill", "experiment", "design"} <= set(entry)
        assert entry["units"]["unit"] == "engine, or the LMCache pool engines share"
    assert body["offload"]["slo"]["quantile"] == "p90"
    assert client.get("/v1/clusters/nope/offload").status_code == 404


def test_cpu_tier_latest_plan_section_returned_with_plan_identity(client: TestClient) -> None:
    plan = client.get(f"/v1/clusters/{CLUSTER}/plan").json()
    resp = client.get(f"/v1/clusters/{CLUSTER}/cpu-tier")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["plan_id"], body["group"]) == (plan["id"], "")
    assert body["cpu_tier"] == (plan["document"].get("cpu_tier") or {})
    CpuTierOut.model_validate(body)
    assert_error(client.get("/v1/clusters/nope/cpu-tier"), 404, "cluster")


def _tier_plan(group: str, created: float, document: dict[str, object]) -> PlanRecord:
    return PlanRecord("tiers", group, created, created - 3600, created - 60, 86_400.0, "0.1.0",
                      "none", document)  # fmt: skip


def test_cpu_tier_saved_sections_served_per_group_older_plan_empty(
    sqlite_url: str, make_client: Callable[..., TestClient]
) -> None:
    now = time.time()
    group, other = "llama-3.1-8b@h100:tp1", "qwen3-8b@h100:tp1"
    with Store(sqlite_url) as store:
        # the cluster's plan is older than the section; its groups' plans carry one each
        store.save_plan(_tier_plan("", now - 120, {"offload": None, "forecast": {}}))
        store.save_plan(_tier_plan(group, now - 60, {"cpu_tier": SECTION}))
        store.save_plan(_tier_plan(other, now - 60, {"cpu_tier": CANNOT}))
    c = make_client(sqlite_url)
    url = "/v1/clusters/tiers/cpu-tier"
    whole = c.get(url)
    assert whole.status_code == 200, whole.text
    assert whole.json()["cpu_tier"] == {} and whole.json()["group"] == ""
    body = c.get(url, params={"group": group}).json()
    assert body["group"] == group and body["cpu_tier"] == SECTION
    assert 55 <= body["age_s"] < 3600
    out = CpuTierOut.model_validate(body)  # the published schema holds the contract's section
    native = out.cpu_tier.native
    assert native is not None and native.recommended is not None
    assert native.recommended.gib == 62.0 and native.rows[2].extra_hit_ratio is not None
    assert native.rows[2].extra_hit_ratio.lo == 0.05
    cannot = c.get(url, params={"group": other}).json()["cpu_tier"]
    assert cannot["can_tell"] is False and cannot["native"] is None and cannot["enable"]
    CpuTierOut.model_validate(c.get(url, params={"group": other}).json())
    assert_error(c.get(url, params={"group": "nope@h100:tp1"}), 404, "group")


def test_cpu_tier_schema_documents_numbers_and_model_based_intervals() -> None:
    doc = create_app(settings_for("sqlite:///unused.db")).openapi()
    op = doc["paths"]["/v1/clusters/{cluster}/cpu-tier"]["get"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CpuTierOut"
    }
    schemas = doc["components"]["schemas"]
    row = schemas["TierRow"]["properties"]
    for name in ("hit_ratio", "extra_hit_ratio", "avoided_prefill_tokens_per_s",
                 "prefill_gpu_seconds_saved_per_hour", "capacity_ratio"):  # fmt: skip
        assert row[name].get("description"), name
    for bound in ("lo", "hi"):
        text = schemas["TierEstimate"]["properties"][bound]["description"]
        assert "model-based" in text and "not a confidence interval" in text
    assert (
        "not a confidence interval"
        in schemas["CpuTierOut"]["properties"]["cpu_tier"]["description"]
    )


def test_accuracy_old_plan_scored_latest_pending(
    client: TestClient, filled_app: tuple[object, Filled]
) -> None:
    _, filled = filled_app
    resp = client.get(f"/v1/clusters/{CLUSTER}/accuracy")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    by_id = {o["plan_id"]: o for o in body["outcomes"]}
    assert by_id[filled.latest_plan_id]["pending"] is True
    old = by_id[filled.old_plan_id]
    assert old["pending"] is False and old["kv_points"] > 0
    assert 0 <= old["coverage"] <= 1
    assert body["summary"]["scored"] == 1 and body["summary"]["pending"] == 1
    metrics = client.get("/metrics").text  # the closed loop's coverage now on /metrics
    assert f'{sm.PLAN_FORECAST_COVERAGE}{{cluster="{CLUSTER}",group=""}}' in metrics


def test_report_known_cluster_serves_html_page(client: TestClient) -> None:
    resp = client.get(f"/v1/clusters/{CLUSTER}/report")
    assert resp.status_code == 200, resp.text[:500]
    assert resp.headers["content-type"].startswith("text/html")
    assert resp.text.lstrip().startswith("<!DOCTYPE html>")
    assert "data:image/png;base64," in resp.text


def test_advise_cheap_whatif_returns_decision(client: TestClient) -> None:
    resp = client.post("/v1/advise", json={**CHEAP_WHATIF, "seed": 7})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["decision"]["mode"] in ("none", "native", "lmcache", "both")
    assert body["inputs"]["model"] == "llama-3.1-8b" and body["inputs"]["seed"] == 7
    assert set(body["simulated"]["modes"]) == {"none", "native", "lmcache"}


def test_compare_tiers_one_tier_both_dtypes_rows(client: TestClient) -> None:
    body = {"model": "llama-3.1-70b-fp8", "tokens": 4096, "tiers": ["ceph-hdd"], "tp": 4,
            "kv_dtype": "both"}  # fmt: skip
    resp = client.post("/v1/costmodel/compare-tiers", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["kv_dtypes"] == ["fp8", "bf16"]
    assert [(c["kv_dtype"], c["tier"]) for c in out["comparisons"]] == [
        ("fp8", "ceph-hdd"),
        ("bf16", "ceph-hdd"),
    ]


def test_savings_priced_prefix_reports_usd(client: TestClient) -> None:
    body = {"model": "llama-3.1-70b", "gpu": "h100", "tp": 4, "prefix_tokens": 6000,
            "queries_per_hour": 200, "gpu_hour_usd": 3.0}  # fmt: skip
    resp = client.post("/v1/costmodel/savings", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["saved_usd_per_hour"] == pytest.approx(
        out["saved_gpu_seconds_per_hour"] / 3600 * 3.0
    )


def test_metrics_latest_plan_gauges_exposed(
    client: TestClient, filled_app: tuple[object, Filled]
) -> None:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    mode = client.get(f"/v1/clusters/{CLUSTER}/plan").json()["mode"]
    assert f'{sm.PLAN_RECOMMENDED_MODE}{{cluster="{CLUSTER}",group="",mode="{mode}"}} 1.0' in text
    age = next(line for line in text.splitlines() if line.startswith(f"{sm.PLAN_AGE}{{"))
    assert math.isfinite(float(age.rsplit(" ", 1)[1]))


def test_targets_list_register_update_delete_round_trip(
    empty_url: str, make_client: Callable[..., TestClient]
) -> None:
    c = make_client(empty_url, allowed_target_networks=("10.0.0.0/8",))
    target = {"name": "engine-0", "url": "http://10.0.0.5:8000/metrics", "cluster": "prod-a"}
    created = c.post("/v1/targets", json=target, headers=AUTH)
    assert created.status_code == 201, created.text
    assert created.json() == {**target, "kind": "vllm"}
    updated = c.post("/v1/targets", json={**target, "kind": "lmcache"}, headers=AUTH)
    assert updated.status_code == 200 and updated.json()["kind"] == "lmcache"
    listed = c.get("/v1/targets").json()["targets"]
    assert listed == [{**target, "kind": "lmcache"}]
    assert c.get("/v1/targets", params={"cluster": "other"}).json() == {"targets": []}
    assert c.delete("/v1/targets/engine-0", headers=AUTH).status_code == 204
    assert c.get("/v1/targets").json() == {"targets": []}
    assert_error(c.delete("/v1/targets/engine-0", headers=AUTH), 404, "name")
