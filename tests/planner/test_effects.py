"""Today's effects (planner/fit/effects.py) and the units they rest on (planner/fit/units.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from core.errors import ConfigError, InsufficientHistory
from planner.fit.effects import fit_today, wls_cr2
from planner.fit.units import UNKNOWN_POOL, balance, traffic, unit_keys
from tests.planner.verdictsynth import cluster_frame


def _today(frame: pd.DataFrame, mode: str = "native", **kw: object) -> object:
    return fit_today(frame, unit_keys(frame, kw.pop("pools", None)), mode=mode, **kw)  # type: ignore[arg-type]


def _effect(t: object, name: str) -> object:
    return next(e for e in t.effects if e.outcome == name)  # type: ignore[attr-defined]


def test_unit_keys_lmcache_rows_join_their_pool_or_the_unknown_pool() -> None:
    frame = pd.DataFrame(
        {"source": ["a", "b", "c", "d"], "engine": ["0", "", "0", "0"],
         "offload_mode": ["none", "lmcache", "lmcache", "native"]}
    )  # fmt: skip
    assert unit_keys(frame, {"b": "node1"}).tolist() == ["a/0", "pool:node1", UNKNOWN_POOL, "d/0"]


def _unit_keys_per_row(frame: pd.DataFrame, pools: dict[str, str]) -> list[object]:
    """unit_keys by its definition, one row at a time (the brute force)."""
    out: list[object] = []
    for source, engine, mode in zip(frame["source"].astype(str), frame["engine"],
                                    frame["offload_mode"].astype(str), strict=True):  # fmt: skip
        empty = engine is None or (isinstance(engine, float) and math.isnan(engine)) or engine == ""
        key = source if empty else f"{source}/{engine}"
        if mode == "lmcache":
            pool = pools.get(key) or pools.get(source)
            out.append(f"pool:{pool}" if pool else UNKNOWN_POOL)
        else:
            out.append(key)
    return out


@pytest.mark.parametrize("categorical", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_unit_keys_equal_the_per_row_definition(seed: int, categorical: bool) -> None:
    rng = np.random.default_rng(seed)
    n = 400
    sources = np.array(["a", "b", "c", "node-7:8000"], dtype=object)  # a row has a source
    engines = np.array(["0", "1", "", None], dtype=object)
    frame = pd.DataFrame(
        {"source": sources[rng.integers(0, 4, n)],
         "engine": engines[rng.integers(0, 4, n)],
         "offload_mode": np.array(["none", "native", "lmcache"])[rng.integers(0, 3, n)]}
    )  # fmt: skip
    if categorical:
        frame = frame.astype({"source": "category", "engine": "category"})
    pools = {"a/0": "p1", "b": "p2", "c/1": "p1", "node-7:8000": "p3", "a": "p4"}
    pools = dict(list(pools.items())[: seed % 6])
    assert unit_keys(frame, pools).tolist() == _unit_keys_per_row(frame, pools)


def test_traffic_covariates_per_window() -> None:
    frame = pd.DataFrame(
        {"requests": [30.0, 0.0], "window_s": [60.0, 60.0], "output_tokens_per_s": [150.0, 10.0],
         "prompt_tokens_mean": [4000.0, np.nan]}
    )  # fmt: skip
    t = traffic(frame)
    assert t["request_rate"].tolist() == [0.5, 0.0]
    assert t["output_tokens_per_request"].iloc[0] == 300.0
    assert math.isnan(t["output_tokens_per_request"].iloc[1])


def test_balance_smd_equals_hand_computation_and_flags_over_a_quarter() -> None:
    values = pd.DataFrame({"x": [1.0, 2.0, 3.0, 5.0, 6.0, 7.0]})
    treated = np.array([0, 0, 0, 1, 1, 1], dtype=float)
    (b,) = balance(values, treated, np.ones(6))
    pooled = math.sqrt((np.var([5.0, 6.0, 7.0]) + np.var([1.0, 2.0, 3.0])) / 2)
    assert b.smd == pytest.approx((6.0 - 2.0) / pooled) and b.unbalanced


def _dense_cr2(y: np.ndarray, x: np.ndarray, w: np.ndarray, g: np.ndarray) -> np.ndarray:
    """CR2 of the WLS fit by its definition, with n × n matrices (Bell & McCaffrey 2002)."""
    sw = np.sqrt(w / w.mean())
    xs, ys = x * sw[:, None], y * sw
    m = np.linalg.inv(xs.T @ xs)
    e = ys - xs @ (m @ xs.T @ ys)
    meat = np.zeros((x.shape[1], x.shape[1]))
    for c in np.unique(g):
        rows = g == c
        h = xs[rows] @ m @ xs[rows].T
        lam, vec = np.linalg.eigh(np.eye(rows.sum()) - h)
        a = vec @ np.diag(lam**-0.5) @ vec.T
        s = xs[rows].T @ a @ e[rows]
        meat += np.outer(s, s)
    return m @ meat @ m


def test_wls_cr2_equals_the_dense_definition_with_weights_and_unequal_clusters() -> None:
    rng = np.random.default_rng(7)
    g = np.repeat(np.arange(5), [3, 7, 4, 9, 5])
    x = np.column_stack([np.ones(g.size), (g % 2).astype(float), rng.normal(size=g.size)])
    y = x @ [1.0, 0.3, -0.2] + rng.normal(size=g.size) + rng.normal(size=5)[g]
    w = rng.uniform(1, 50, g.size)
    b, se, df = wls_cr2(y, x, w, g.astype(np.int64), column=1)
    dense = _dense_cr2(y, x, w, g)
    assert se == pytest.approx(math.sqrt(dense[1, 1]), rel=1e-9)
    ref = np.linalg.lstsq(x * np.sqrt(w)[:, None], y * np.sqrt(w), rcond=None)[0]
    assert b == pytest.approx(ref[1]) and 0 < df < 5


def test_fit_today_recovers_a_known_ttft_effect() -> None:
    frame = cluster_frame(["none"] * 3 + ["native"] * 3, ratio={}, seed=1,
                          ttft_effect={"native": math.log(0.6)})  # fmt: skip
    e = _effect(_today(frame), "ttft_p90_s")
    assert e.can_tell and e.scale == "ratio"  # type: ignore[attr-defined]
    assert e.interval.lo < 0.6 < e.interval.hi  # type: ignore[attr-defined]


def test_fit_today_one_unit_per_arm_cannot_tell() -> None:
    frame = cluster_frame(["none", "none", "native"], ratio={}, seed=2)
    t = _today(frame)
    assert not t.can_tell and "at least 2 independent" in t.why  # type: ignore[attr-defined]
    assert all(not e.can_tell for e in t.effects)  # type: ignore[attr-defined]


def test_fit_today_two_engines_of_one_pool_are_one_unit() -> None:
    frame = cluster_frame(["none"] * 3 + ["lmcache"] * 2, ratio={}, seed=3, pools={3: "p", 4: "p"})
    t = _today(frame, mode="lmcache", pools={"e3": "p", "e4": "p"})
    assert (t.units_treated, t.engines_treated) == (1, 2) and not t.can_tell  # type: ignore[attr-defined]
    assert "count once" in t.why  # type: ignore[attr-defined]


def test_fit_today_adjusts_for_a_router_sending_longer_prompts_to_one_arm() -> None:
    # no effect of the mode; the offload engines get 8k-token prompts, the others 4k
    prompt = [4000.0] * 3 + [8000.0] * 3
    frame = cluster_frame(["none"] * 3 + ["native"] * 3, ratio={}, seed=4, prompt=prompt,
                          peak=0.6)  # fmt: skip
    naive = _effect(_today(frame, adjust=False), "ttft_p90_s")
    adjusted = _effect(_today(frame), "ttft_p90_s")
    assert naive.interval.lo > 1.5  # type: ignore[attr-defined]  # confounded: e^1 ≈ 2.7×
    t = _today(frame)
    assert any("prompt tokens per request" in w for w in t.warnings)  # type: ignore[attr-defined]
    # constant per arm here: no adjustment can separate prompt length from the mode
    assert not adjusted.can_tell and "differs only between the arms" in adjusted.why  # type: ignore[attr-defined]


def test_fit_today_adjustment_removes_prompt_mix_that_varies_within_the_arms() -> None:
    # no effect of the mode; the router sends the offload engines prompts twice as long on
    # average, and prompt length varies from window to window on every engine
    prompt = [3000.0] * 3 + [6000.0] * 3
    frame = cluster_frame(["none"] * 3 + ["native"] * 3, ratio={}, seed=8, prompt=prompt,
                          prompt_sd=0.4, peak=0.6)  # fmt: skip
    naive = _effect(_today(frame, adjust=False), "ttft_p90_s")
    adjusted = _effect(_today(frame), "ttft_p90_s")
    assert naive.interval.lo > 1.5  # type: ignore[attr-defined]
    assert adjusted.interval.lo < 1.0 < adjusted.interval.hi  # type: ignore[attr-defined]


def test_fit_today_refuses_none_as_the_mode_and_mismatched_units() -> None:
    frame = cluster_frame(["none"] * 2 + ["native"] * 2, ratio={}, seed=5)
    with pytest.raises(ConfigError, match="compares an offload mode"):
        fit_today(frame, unit_keys(frame), mode="none")
    with pytest.raises(ConfigError, match="units has"):
        fit_today(frame, ["x"], mode="native")


def test_fit_today_too_few_windows_raises() -> None:
    frame = cluster_frame(["none"] * 2 + ["native"] * 2, ratio={}, seed=6, windows=10)
    with pytest.raises(InsufficientHistory):
        _today(frame)


def _null_claims(engines: int, reps: int) -> tuple[float, float]:
    """Share of 90 % TTFT-p90 intervals excluding 1 with no effect, and of 90 % intervals
    covering a true effect of 0.7, on ``engines`` + ``engines`` engines with engine spread."""
    false = covered = 0
    for seed in range(reps):
        modes = ["none"] * engines + ["native"] * engines
        null = cluster_frame(modes, ratio={}, seed=2000 + seed, unit_sd=0.0, peak=0.6)
        # engine-level spread the windows do not average away: each engine's own TTFT level
        null["ttft_p90_s"] *= np.exp(0.2 * np.random.default_rng(seed).normal(size=2 * engines))[
            null["source"].str[1:].astype(int).to_numpy()
        ]
        e = _effect(_today(null, adjust=False), "ttft_p90_s")
        false += e.interval.lo > 1 or e.interval.hi < 1  # type: ignore[attr-defined]
        hit = null.copy()
        hit.loc[hit["offload_mode"] == "native", "ttft_p90_s"] *= 0.7
        f = _effect(_today(hit, adjust=False), "ttft_p90_s")
        covered += f.interval.lo <= 0.7 <= f.interval.hi  # type: ignore[attr-defined]
    return false / reps, covered / reps


def test_fit_today_engine_clustered_intervals_hold_their_level_with_two_engines_per_arm() -> None:
    false, covered = _null_claims(2, 150)
    # nominal 0.10 and 0.90; 150 replicates: 3 binomial SDs ≈ 0.07
    assert false <= 0.17 and covered >= 0.83
