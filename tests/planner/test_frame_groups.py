"""planner.frames.groups: each engine's model group, splitting a frame by group, and
planner.fit.orchestrate.fit_all fitting each group of a frame on its own."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from benchmarks.accuracy.fitsynth import synthetic_frame
from core.errors import ConfigError
from core.records import Window, labels_of
from planner.fit.orchestrate import fit_all
from planner.fit.preempt import fit_preemption
from planner.fit.registry import FIT_NAMES
from planner.frames.frames import engine_frame
from planner.frames.groups import (
    UNKNOWN_GROUP,
    GroupSlice,
    _engine_mask,
    group_name,
    same_model,
    split_groups,
    text_values,
)
from store.tables import EngineRecord

T0 = 1.8e9


def win(source: str, labels: dict[str, str], signal: str = "kv_cache_usage_ratio",
        start: float = T0, **kw: float) -> Window:  # fmt: skip
    kind = "counter" if signal.endswith("_total") else "gauge"
    values = kw or {"mean": 0.5, "max": 0.6}
    return Window(source=source, signal=signal, labels=labels_of(labels), start=start,
                  length_s=60.0, kind=kind, samples=4, **values)  # type: ignore[arg-type]  # fmt: skip


def record(source: str, model: str | None = None, gpu: str | None = None,
           tp: int | None = None) -> EngineRecord:  # fmt: skip
    return EngineRecord("c", source, model, gpu, None, tp, "none", {})


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "expected"),
    [
        ("llama", "h100-80gb", 4, "llama@h100-80gb:tp4"),
        ("llama", None, 2, "llama:tp2"),
        ("llama", "h200-141gb", None, "llama@h200-141gb"),
        ("meta-llama/Llama-3.1-8B", None, None, "meta-llama/Llama-3.1-8B"),
        (None, "h100-80gb", 1, UNKNOWN_GROUP),
        ("", "h100-80gb", 1, UNKNOWN_GROUP),
        ("llama", "", 0, "llama"),
        ("llama", None, True, "llama"),  # a bool is not a TP size
    ],
)
def test_group_name_known_parts_only(model: str | None, gpu: str | None, tp: object,
                                     expected: str) -> None:  # fmt: skip
    assert group_name(model, gpu, tp) == expected


def test_engine_frame_group_from_label_then_record_else_unknown() -> None:
    windows = [
        win("a", {"engine": "0", "model_name": "served-8b"}),
        win("b", {"engine": "0"}),  # no label: the record's model
        win("c", {"engine": "0"}),  # neither: unknown
        win("d", {"engine": "0", "model_name": "served-70b"}),
    ]
    meta = {"a": record("a", "llama-3.1-8b", "h100-80gb", 1),
            "b": record("b", "llama-3.1-8b", "h100-80gb", 1),
            "d": record("d", None, "h200-141gb", 4)}  # fmt: skip
    got = engine_frame(windows, meta).set_index("source")["group"].to_dict()
    assert got == {"a": "served-8b@h100-80gb:tp1", "b": "llama-3.1-8b@h100-80gb:tp1",
                   "c": UNKNOWN_GROUP, "d": "served-70b@h200-141gb:tp4"}  # fmt: skip


def test_engine_frame_group_prefers_engine_series_label_over_lmcache_label() -> None:
    # LMCache legacy series (no engine label) name the HF path; vLLM's name the served model.
    windows = [win("a", {"engine": "0", "model_name": "served"}, start=T0 + 60 * i)
               for i in range(2)]  # fmt: skip
    windows += [win("a", {"worker_id": "0", "model_name": "org/Model"}, "lmcache_hit_ratio",
                    start=T0 + 60 * i, mean=0.5, delta=10.0) for i in range(5)]  # fmt: skip
    got = engine_frame(windows)
    assert got["group"].tolist() == ["served"] * 5


def test_engine_frame_group_json_labels_and_model_column_agree() -> None:
    windows = [win("a", {"engine": "0", "model_name": "m1"}),
               win("b", {"engine": "0", "model_name": "m2"})]  # fmt: skip
    fields = ["source", "signal", "start", "length_s", "mean", "max"]
    table = pd.DataFrame([{f: getattr(w, f) for f in fields} for w in windows])
    as_json = table.assign(labels=[json.dumps(dict(w.labels)) for w in windows])
    as_column = table.assign(engine=["0", "0"], model_name=["m1", "m2"])
    for t in (as_json, as_column):
        assert engine_frame(t)["group"].tolist() == ["m1", "m2"]


def _frame_rows(rows: list[tuple[str, str, str, float | None]]) -> pd.DataFrame:
    records = [
        {"source": s, "engine": e, "group": g, "kv_util": u, "tokens_per_s": None}
        for s, e, g, u in rows
    ]
    return pd.DataFrame(records).astype({"kv_util": float, "tokens_per_s": float})


def test_split_groups_attaches_lmcache_rows_by_model_and_shares_the_rest() -> None:
    frame = _frame_rows([
        ("a", "0", "m1@h100:tp1", 0.5), ("b", "0", "m2:tp4", 0.4),
        ("lm-1", "", "m1", None),  # an LMCache server naming m1: joins m1's group
        ("lm-2", "", "org/Other", None),  # names no group's model: shared
    ])  # fmt: skip
    groups = split_groups(frame, ["a", "b", "lm-1", "lm-2", "health-only"])
    assert [g.name for g in groups] == ["m1@h100:tp1", "m2:tp4"]
    m1, m2 = groups
    assert m1.engines == ("a/0",) and m2.engines == ("b/0",)
    assert m1.rows.tolist() == [True, False, True, True]
    assert m2.rows.tolist() == [False, True, False, True]
    assert m1.sources == {"a", "lm-1", "lm-2", "health-only"}
    assert m2.sources == {"b", "lm-2", "health-only"}
    assert m1.shared == ("health-only", "lm-2")
    assert same_model("m1", "m1:tp2") and not same_model("m1", "m10@h100")
    assert not same_model(UNKNOWN_GROUP, "m1") and split_groups(frame.iloc[:0], []) == []


def _split_by_strings(frame: pd.DataFrame, table_sources: list[str]) -> list[GroupSlice]:
    """split_groups as first written, on each row's ``astype(str)`` text (the brute force)."""
    group = frame["group"].astype(str).to_numpy(dtype=object)
    source = frame["source"].astype(str).to_numpy(dtype=object)
    engine = frame["engine"].astype(str).to_numpy(dtype=object)
    is_engine = _engine_mask(frame)
    if not is_engine.any():
        is_engine = np.ones(len(frame), dtype=bool)
    names = sorted({str(g) for g in set(group[is_engine].tolist())})
    member = {n: is_engine & (group == n) for n in names}
    shared_rows = np.zeros(len(frame), dtype=bool)
    for g in sorted({str(x) for x in set(group[~is_engine].tolist())}):
        rows = ~is_engine & (group == g)
        homes = [n for n in names if same_model(g, n)]
        if not homes:
            shared_rows |= rows
        for n in homes:
            member[n] = member[n] | rows
    in_frame = {str(s) for s in set(source.tolist())}
    shared = sorted({str(s) for s in set(source[shared_rows].tolist())}
                    | (set(table_sources) - in_frame))  # fmt: skip
    out = []
    for n in names:
        rows = member[n] | shared_rows
        eng = is_engine & (group == n)
        pairs = sorted(
            {
                (str(s), str(e))
                for s, e in zip(source[eng].tolist(), engine[eng].tolist(), strict=True)
            }
        )
        out.append(GroupSlice(n, tuple(f"{s}/{e}" if e else s for s, e in pairs),
                              frozenset({str(s) for s in set(source[rows].tolist())} | set(shared)),
                              rows, tuple(shared)))  # fmt: skip
    return out


@pytest.mark.parametrize("categorical", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_split_groups_equals_the_split_on_each_rows_text(seed: int, categorical: bool) -> None:
    rng = np.random.default_rng(seed)
    n = 300

    def pick(values: list[str | None]) -> np.ndarray:
        return np.asarray(values, dtype=object)[rng.integers(0, len(values), n)]

    frame = pd.DataFrame({
        "source": pick(["a", "b", "lm-1", "lm-2", None, "nan"]),
        "engine": pick(["0", "1", "", None]),
        "group": pick(["m1@h100:tp1", "m2:tp4", "m1", "org/Other", UNKNOWN_GROUP, None, "nan"]),
        "kv_util": np.where(rng.random(n) < (0.0 if seed == 3 else 0.6), 0.5, np.nan),
        "tokens_per_s": np.nan,
    })  # fmt: skip
    if categorical:
        frame = frame.astype({"source": "category", "engine": "category"})
    else:
        frame = frame.astype({"source": "str", "engine": "str", "group": "str"})
    tables = [["a", "health-only"], [], ["nan", "x"]][seed % 3]
    got, want = split_groups(frame, tables), _split_by_strings(frame, tables)
    assert [g.name for g in got] == [g.name for g in want]
    for g, w in zip(got, want, strict=True):
        assert (g.engines, g.sources, g.shared) == (w.engines, w.sources, w.shared)
        assert g.rows.tolist() == w.rows.tolist()


def _two_group_frame() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    a = synthetic_frame(6, 200, seed=3, modes=("none",)).assign(group="a")
    b = synthetic_frame(4, 200, seed=8, modes=("none",)).assign(group="b")
    b["source"] = "b-" + b["source"].astype(str)
    return a, b, pd.concat([a, b], ignore_index=True)


def test_fit_all_two_groups_fits_each_alone_and_nothing_across() -> None:
    a, b, both = _two_group_frame()
    report = fit_all(both)
    assert [o.name for o in report.skipped] == list(FIT_NAMES)  # nothing fitted across them
    assert all(o.why and "2 model groups (a, b)" in o.why for o in report.skipped)
    assert report.seconds == ()
    assert [name for name, _ in report.groups] == ["a", "b"]
    for (_, sub), frame in zip(report.groups, (a, b), strict=True):
        knee = sub.result("preemption_knee")
        assert knee is not None
        assert knee.estimate == pytest.approx(fit_preemption(frame).estimate, rel=1e-9)
        assert knee.n == len(frame)
    d = json.loads(json.dumps(report.as_dict(), allow_nan=False))
    assert [g["name"] for g in d["groups"]] == ["a", "b"]
    first = report.groups[0][1].result("preemption_knee")
    assert first is not None
    assert d["groups"][0]["fits"]["preemption_knee"]["estimate"] == pytest.approx(first.estimate)


def test_fit_all_one_cost_model_for_two_groups_skips_their_mfu() -> None:
    _, _, both = _two_group_frame()
    report = fit_all(both, prefill_flops=lambda t: 1e9 * t, peak_flops=1e15)
    for _, sub in report.groups:
        assert sub.result("prefill_mfu") is None
        assert any(s.name == "prefill_mfu" and s.why and "several model groups" in s.why
                   for s in sub.skipped)  # fmt: skip


def test_fit_all_group_argument_fits_that_group_and_rejects_unknown() -> None:
    a, _, both = _two_group_frame()
    report = fit_all(both, group="a")
    knee = report.result("preemption_knee")
    assert report.groups == () and knee is not None
    assert knee.estimate == pytest.approx(fit_preemption(a).estimate, rel=1e-9)
    assert "groups" not in report.as_dict()
    with pytest.raises(ConfigError, match=r"'c' is not in the frame; its groups are 'a', 'b'"):
        fit_all(both, group="c")


@pytest.mark.parametrize(
    "column",
    [
        pytest.param(
            pd.Series(["native", "none", None, "lmcache"], dtype="category"),
            id="categorical-with-missing",
        ),
        pytest.param(
            pd.Series(pd.Categorical(["b", "a"], categories=["a", "b", "c"])),
            id="categorical-unused-category",
        ),
        pytest.param(pd.Series(["native", None, "none"], dtype=object), id="object-with-missing"),
        pytest.param(pd.Series(["x", "y"], dtype="str"), id="str"),
        pytest.param(pd.Series([], dtype="category"), id="empty"),
    ],
)
def test_text_values_are_each_value_as_text(column: pd.Series) -> None:
    got = text_values(column)
    assert got.dtype == object
    assert got.tolist() == ["nan" if pd.isna(v) else str(v) for v in column.tolist()]
