"""The SQL store on a real SQLite file and a real PostgreSQL 15 (every test runs on both)."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pytest
import sqlalchemy

from core.errors import ConfigError, StoreError
from core.records import Labels, ScrapeOutcome, Window
from store.frame import CATEGORY_COLUMNS, FRAME_COLUMNS, windows_frame
from store.migrate import MIGRATIONS
from store.store import Store, redact
from store.tables import SCHEMA_VERSION

ENGINE: Labels = (("engine", "0"), ("model_name", "llama"))
T0 = 1_764_000_000.0


def win(source: str = "e1", signal: str = "kv_cache_usage_ratio", start: float = T0,
        labels: Labels = ENGINE, **values: float | None) -> Window:  # fmt: skip
    kind = "gauge" if "usage" in signal else "counter"
    return Window(source, signal, labels, start, 60.0, kind, 4, **values)  # type: ignore[arg-type]


def grid(sources: int = 3, signals: int = 4, minutes: int = 5) -> list[Window]:
    return [
        win(f"e{s}", f"sig_{k}_usage", T0 + 60.0 * m, mean=s + k / 10 + m / 100)
        for m in range(minutes)
        for s in range(sources)
        for k in range(signals)
    ]


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store(db_url) as s:
        s.migrate()
        yield s


def test_migrate_fresh_sets_version_and_is_idempotent(db_url: str) -> None:
    with Store(db_url) as s:
        assert s.schema_version() is None
        assert s.migrate() == SCHEMA_VERSION
        assert s.migrate() == SCHEMA_VERSION
        assert s.schema_version() == SCHEMA_VERSION
        assert s.stats()["windows"] == 0


def test_write_windows_same_rows_twice_same_count_values_updated(store: Store) -> None:
    rows = grid()
    assert store.write_windows(rows) == len(rows)
    assert store.write_windows(rows) == len(rows)
    assert store.stats()["windows"] == len(rows)
    changed = [win(w.source, w.signal, w.start, mean=-1.0, max=2.0) for w in rows[:5]]
    store.write_windows(changed)
    back = store.read_windows()
    assert len(back) == len(rows)
    by_key = {(w.source, w.signal, w.start): w for w in back}
    for w in changed:
        assert by_key[(w.source, w.signal, w.start)] == w  # every value replaced, None included


def test_write_windows_repeated_key_in_one_call_keeps_last(store: Store) -> None:
    store.write_windows([win(mean=1.0), win(mean=2.0), win(mean=3.0)])
    assert [w.mean for w in store.read_windows()] == [3.0]


def test_write_windows_small_batches_all_written(db_url: str) -> None:
    with Store(db_url, batch_size=7) as s:
        s.migrate()
        rows = grid()
        assert s.write_windows(iter(rows)) == len(rows)
        assert len(s.read_windows()) == len(rows)


def test_read_windows_filters_and_order(store: Store) -> None:
    store.write_windows(reversed(grid()))
    store.upsert_target("e0", "http://10.0.0.1:8000/metrics", cluster="east")
    store.upsert_engine("east", "e1", model="llama")
    store.upsert_target("e2", "http://10.0.0.3:8000/metrics", cluster="west")
    everything = store.read_windows()
    assert everything == sorted(everything, key=lambda w: (w.source, w.signal, w.start))
    assert {w.signal for w in store.read_windows(signals=["sig_1_usage"])} == {"sig_1_usage"}
    assert {w.source for w in store.read_windows(sources=["e2", "nope"])} == {"e2"}
    assert {w.source for w in store.read_windows(cluster="east")} == {"e0", "e1"}
    assert store.read_windows(cluster="nowhere") == []
    window = store.read_windows(since=T0 + 60, until=T0 + 180)
    assert {w.start for w in window} == {T0 + 60, T0 + 120}
    both = store.read_windows(signals=["sig_0_usage"], sources=["e0"], since=T0 + 240)
    assert [(w.source, w.signal, w.start) for w in both] == [("e0", "sig_0_usage", T0 + 240)]


def test_epoch_floats_and_labels_round_trip_exactly(store: Store) -> None:
    odd: Labels = (("engine", "0"), ("model_name", "Qwen/Qwen3-235B"), ("path", 'a"b\\c ü 😀'))
    starts = [1_764_000_000.123456789, 0.1 + 0.2, 2**53 - 1.0, 1e-300, 1_700_000_000.5 + 1e-6]
    rows = [win(start=s, labels=odd, mean=s / 3, p99=math.pi, min=-0.0, max=1e308) for s in starts]
    store.write_windows(rows)
    assert sorted(store.read_windows(), key=lambda w: w.start) == sorted(
        rows, key=lambda w: w.start
    )
    assert store.read_windows(since=starts[0], until=math.nextafter(starts[0], math.inf)) == [
        rows[0]
    ]


def test_nan_values_stored_as_unknown(store: Store) -> None:
    store.write_windows([win(mean=math.nan, max=1.0, p50=math.nan)])
    (back,) = store.read_windows()
    assert (back.mean, back.max, back.p50) == (None, 1.0, None)


@pytest.mark.parametrize("start", [math.nan, math.inf, -math.inf])
def test_non_finite_start_refused_with_store_error(store: Store, start: float) -> None:
    with pytest.raises(StoreError, match="non-finite start"):
        store.write_windows([win(start=start)])


@pytest.mark.parametrize(
    ("values", "says"),
    [({"samples": 2**40}, "out of range"), ({"resets": 2**31}, "out of range"),
     ({"samples": 4.5}, "not of its column's type"), ({"mean": "x"}, "not of its column's type")],
)  # fmt: skip
def test_value_outside_its_column_refused_on_postgres(
    store: Store, values: dict[str, Any], says: str
) -> None:
    if store.dialect != "postgresql":
        pytest.skip("SQLite keeps what its columns' affinity allows")
    bad = dataclasses.replace(win(start=T0), **values)
    with pytest.raises(StoreError, match=says):  # binary COPY: refused as the text one was
        store.write_windows([win(start=T0 + 60.0), bad])
    assert store.read_windows() == []
    store.write_windows([win()])  # the connection writes on
    assert len(store.read_windows()) == 1


def test_schema_newer_than_code_refused(db_url: str) -> None:
    with Store(db_url) as s:
        s.migrate()
        s.write_windows([win()])
    _set_version(db_url, SCHEMA_VERSION + 1)
    with Store(db_url) as s:
        with pytest.raises(StoreError, match="newer than this kvscope"):
            s.migrate()
        with pytest.raises(StoreError, match="newer than this kvscope"):
            s.read_windows()
        assert s.schema_version() == SCHEMA_VERSION + 1


def _set_version(db_url: str, version: int) -> None:
    if db_url.startswith("sqlite:///"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as con:
            con.execute(f"UPDATE schema_version SET version = {version}")
        return
    server, options = db_url.replace("postgresql+psycopg://", "postgresql://").split("?")
    schema = options.rsplit("%3D", 1)[1]
    with psycopg.connect(server, autocommit=True) as con:
        con.execute(f"UPDATE {schema}.schema_version SET version = {version}")


def test_schema_older_refused_then_upgraded_by_migrate(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(db_url) as s:
        s.migrate()
        s.write_windows([win()])
    _set_version(db_url, 0)  # no step turns version 0 into 1
    with Store(db_url) as s:
        with pytest.raises(StoreError, match="older than"):
            s.read_windows()
        with pytest.raises(StoreError, match="no upgrade path from schema version 0"):
            s.migrate()
    steps: list[int] = []
    monkeypatch.setitem(MIGRATIONS, 0, lambda conn: steps.append(0))
    with Store(db_url) as s:
        assert s.migrate() == SCHEMA_VERSION
        assert steps == [0]
        assert s.read_windows() == [win()]  # data kept across the upgrade


def test_schema_1_without_plans_table_upgraded_keeps_windows(db_url: str) -> None:
    with Store(db_url) as s:
        s.migrate()
        s.write_windows([win()])
    engine = sqlalchemy.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("DROP TABLE plans"))
        conn.execute(sqlalchemy.text("DROP TABLE engine_changes"))
        conn.execute(sqlalchemy.text("DROP TABLE rollup_states"))
    engine.dispose()
    _set_version(db_url, 1)
    with Store(db_url) as s:
        assert s.migrate() == SCHEMA_VERSION == 10
        assert s.read_windows() == [win()] and s.plans() == [] and s.engine_changes() == {}
        assert s.take_rollup_states(["e1"]) == {}


def test_schema_7_plans_keep_their_gain_under_its_name_and_gain_capacity_columns(
    db_url: str,
) -> None:
    """7 -> 8: a plan stored by schema 7 keeps its equal-KV gain (renamed, the values kept)
    and its new capacity columns are empty (None: the plan never measured them)."""
    with Store(db_url) as s:
        s.migrate()
    engine = sqlalchemy.create_engine(db_url)
    ends = ("", "_lo", "_hi")
    with engine.begin() as conn:  # the plans table as schema 7 had it
        for m in ("native", "lmcache"):
            for end in ends:
                conn.execute(sqlalchemy.text(f"ALTER TABLE plans DROP COLUMN capacity_{m}{end}"))
                conn.execute(sqlalchemy.text(
                    f"ALTER TABLE plans RENAME COLUMN equal_kv_gain_{m}{end} TO gain_{m}_now{end}"
                ))  # fmt: skip
    engine.dispose()
    _set_version(db_url, 7)
    old = {f"gain_native_now{e}": v for e, v in zip(ends, (0.2, 0.1, 0.3), strict=True)}
    engine = sqlalchemy.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("INSERT INTO clusters (name) VALUES ('c')"))
        cid = conn.execute(sqlalchemy.text("SELECT id FROM clusters WHERE name = 'c'")).scalar()
        cols = ", ".join(old)
        conn.execute(
            sqlalchemy.text(
                "INSERT INTO plans (cluster_id, group_name, created_at, window_from, window_until,"
                f" horizon_s, version, mode, document, {cols}) VALUES (:c, '', 1.0, 0.0, 1.0, "
                f"60.0, 'v', 'native', '{{}}', {', '.join(map(str, old.values()))})"
            ),
            {"c": cid},
        )
    engine.dispose()
    with Store(db_url) as s:
        assert s.migrate() == SCHEMA_VERSION == 10
        (plan,) = s.latest_plans("c")
    h = plan.headline
    assert (h["equal_kv_gain_native"], h["equal_kv_gain_native_lo"]) == (0.2, 0.1)
    assert h["equal_kv_gain_native_hi"] == 0.3
    assert h["capacity_native"] is None and h["capacity_lmcache_hi"] is None


def test_engine_change_recorded_only_when_regime_changes(db_url: str) -> None:
    with Store(db_url) as s:
        s.migrate()
        s.upsert_engine("c", "e1", offload="none", gpu="h100")  # configured: no change row
        assert s.engine_changes() == {}
        off = {"num_gpu_blocks": 100, "offload_basis": "exposed: size None"}
        s.upsert_engine("c", "e1", offload="none", facts=off, observed_at=10.0)
        s.upsert_engine("c", "e1", offload="none", facts=off, observed_at=20.0)  # same regime
        on = {"num_gpu_blocks": 100, "num_cpu_blocks": 400, "offload_basis": "exposed: spec"}
        s.upsert_engine("c", "e1", offload="native", facts=on, observed_at=30.0)
        s.upsert_engine("c", "e1", offload="native", facts=on, observed_at=40.0)
        s.upsert_engine("c", "e1", offload="native", facts=on, tensor_parallel=2,
                        observed_at=50.0)  # fmt: skip
        (engine,) = s.engines()
        got = [(c.at, c.offload, c.facts.get("num_cpu_blocks"), c.facts.get("tensor_parallel"))
               for c in engine.changes]  # fmt: skip
        assert got == [(10.0, "none", None, None), (30.0, "native", 400, None),
                       (50.0, "native", 400, 2)]  # fmt: skip
        assert engine.changes[1].facts["offload_basis"] == "exposed: spec"
        with pytest.raises(StoreError, match="observed_at must be finite"):
            s.upsert_engine("c", "e1", offload="none", observed_at=float("nan"))
        assert len(s.engines()[0].changes) == 3  # the failed upsert left nothing behind


def test_unmigrated_database_refused_with_hint(db_url: str) -> None:
    with Store(db_url) as s, pytest.raises(StoreError, match="kvscope db migrate"):
        s.write_windows([win()])


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("not a url", "bad database URL"),
        ("mysql://kv:s3cr3t@127.0.0.1/kv", "only sqlite"),
        ("postgresql://kv:s3cr3t@127.0.0.1:1/kv", "cannot open database"),
        ("postgresql+psycopg://kv:s3cr3t@127.0.0.1:1/kv", "cannot open database"),
        ("postgresql://kv:s3cr3t@127.0.0.1:port/kv", "bad database URL"),
        ("sqlite:////proc/kvscope/denied/kv.db", "cannot open database"),
    ],
)
def test_bad_url_store_error_names_url_without_password(url: str, says: str) -> None:
    with pytest.raises(StoreError) as info:
        Store(url)
    message = str(info.value)
    assert says in message
    assert "s3cr3t" not in message
    assert redact(url) in message


def test_redact_hides_password_even_unparsable() -> None:
    assert redact("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    assert "pw" not in redact("weird://u:pw@h:x:y/db")


@pytest.mark.parametrize("migrate_too", [False, True])
def test_concurrent_writers_do_not_duplicate(db_url: str, migrate_too: bool) -> None:
    rows = grid(sources=4, signals=10, minutes=10)
    if not migrate_too:
        with Store(db_url) as s:
            s.migrate()
    # Opening the store is part of the race (a fresh SQLite file switched to WAL by three
    # connections at once used to fail one of them with "database is locked").
    barrier = threading.Barrier(3, timeout=60)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            barrier.wait()
            with Store(db_url, batch_size=50) as s:
                if migrate_too:
                    s.migrate()
                s.write_windows(rows)
                s.write_windows(reversed(rows))
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()  # a writer that failed must not leave the others waiting

    threads = [threading.Thread(target=writer, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    assert errors == []
    with Store(db_url) as s:
        assert s.stats()["windows"] == len(rows)
        assert s.read_windows() == sorted(rows, key=lambda w: (w.source, w.signal, w.start))


def test_outcomes_written_once_per_target_and_start(store: Store) -> None:
    ok = ScrapeOutcome("e1", T0, 0.05, True, 12_345, 321)
    bad = ScrapeOutcome("e2", T0 + 0.25, 10.0, False, error_kind="timeout", error="read timed out")
    assert store.write_outcomes([ok, bad, ok]) == 3
    store.write_outcomes([ok])
    assert store.outcomes() == [ok, bad]
    assert store.outcomes(targets=["e2"]) == [bad]
    assert store.outcomes(since=T0 + 0.1) == [bad]
    assert store.outcomes(until=T0 + 0.1) == [ok]
    assert store.write_outcomes([]) == 0


def test_engine_upsert_keeps_unset_fields_and_replaces_facts(store: Store) -> None:
    first = store.upsert_engine("east", "e1", model="llama", gpu="H100", hbm_gb=80.0,
                                tensor_parallel=2, offload="lmcache",
                                facts={"cache_config": ({"block_size": "16"},)})  # fmt: skip
    assert first.facts == {"cache_config": [{"block_size": "16"}]}
    second = store.upsert_engine("west", "e1", gpu="H200", facts={"num_gpu_blocks": 1024})
    assert (second.cluster, second.model, second.gpu, second.hbm_gb, second.tensor_parallel,
            second.offload, second.facts) == (
        "west", "llama", "H200", 80.0, 2, "lmcache", {"num_gpu_blocks": 1024})  # fmt: skip
    store.upsert_engine("east", "e2")
    assert [e.source for e in store.engines()] == ["e2", "e1"]  # by cluster, source
    assert [e.source for e in store.engines("west")] == ["e1"]
    assert store.engines("east")[0].offload == "none"


@pytest.mark.parametrize(
    "kwargs",
    [{"offload": "gpu"}, {"hbm_gb": -1.0}, {"hbm_gb": math.nan}, {"tensor_parallel": 0}],
)
def test_engine_bad_field_config_error(store: Store, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="e1"):
        store.upsert_engine("east", "e1", **kwargs)  # type: ignore[arg-type]
    assert store.engines() == []


def test_engine_facts_not_json_store_error_names_key(store: Store) -> None:
    with pytest.raises(StoreError, match=r"facts\.when"):
        store.upsert_engine("east", "e1", facts={"when": object()})


def test_targets_and_clusters_upsert(store: Store) -> None:
    store.upsert_target("e1", "http://a/metrics", kind="vllm", cluster="east")
    store.upsert_target("e1", "http://b/metrics", kind="lmcache", cluster="west")
    assert [(t.name, t.url, t.kind, t.cluster) for t in store.targets()] == [
        ("e1", "http://b/metrics", "lmcache", "west")
    ]
    assert store.upsert_cluster("east") == store.upsert_cluster("east")
    with pytest.raises(ConfigError, match="kind"):
        store.upsert_target("e3", "http://c", kind="redis")
    with pytest.raises(ConfigError, match="cluster name"):
        store.upsert_cluster("")


def test_delete_target_existing_removed_absent_false(store: Store) -> None:
    store.upsert_target("e1", "http://a/metrics", cluster="east")
    store.upsert_target("e2", "http://b/metrics", cluster="east")
    store.write_outcomes([ScrapeOutcome("e1", T0, 0.1, True)])
    assert store.delete_target("e1") is True
    assert [t.name for t in store.targets()] == ["e2"]
    assert store.delete_target("e1") is False  # already gone
    assert store.delete_target("never") is False
    assert [o.target for o in store.outcomes()] == ["e1"]  # its history stays
    store.upsert_target("e1", "http://c/metrics", cluster="west")  # the name can come back
    assert [(t.name, t.cluster) for t in store.targets()] == [("e2", "east"), ("e1", "west")]


def test_stats_counts_range_and_signals(store: Store) -> None:
    store.write_windows(grid(sources=2, signals=3, minutes=4))
    stats = store.stats()
    assert stats["windows"] == 24
    assert (stats["windows_from"], stats["windows_until"]) == (T0, T0 + 4 * 60)
    # a series is one source's (the same labels on two sources are two series)
    assert stats["signals"]["sig_0_usage"] == {"windows": 8, "series": 2}
    assert stats["rows"]["series"] == 6


def test_sqlite_file_uses_wal_and_creates_parent(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "kv.db"
    with Store(f"sqlite:///{path}") as s:
        s.migrate()
        s.write_windows([win()])
    assert path.exists()
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_in_memory_sqlite_works() -> None:
    with Store("sqlite://") as s:
        s.migrate()
        s.write_windows(grid(1, 1, 2))
        assert len(s.read_windows()) == 2


# -- read_frame: the columnar read ----------------------------------------------------------

ODD: Labels = (("model_name", 'Qwen/Qwen3 "235B" \\ ü 😀'), ("path", "a,b=c|d"))


def _nan_at(m: int, x: float) -> float:
    return math.nan if m == 2 else x


def mixed() -> list[Window]:
    """Counters, gauges, histograms and ratios; NaN values; odd and engine-less labels."""
    eng1: Labels = (("engine", "1"), ("model_name", "llama"))
    reason: Labels = (("engine", "0"), ("finished_reason", "stop"), ("model_name", "llama"))
    out: list[Window] = []
    for m in range(4):
        t = T0 + 60.0 * m
        out += [
            Window("e1", "preemptions_total", ENGINE, t, 60.0, "counter", 4,
                   delta=_nan_at(m, float(m)), rate=m / 60, resets=m % 2),
            Window("e1", "request_success_total", reason, t, 59.5, "counter", 3, delta=2.0),
            Window("e1", "kv_cache_usage_ratio", ENGINE, t, 60.0, "gauge", 4,
                   mean=0.1 * m, min=-0.0, max=_nan_at(m, 0.5), last=0.3),
            Window("e1", "kv_cache_usage_ratio", eng1, t, 60.0, "gauge", 4, mean=1e-300, max=1e308),
            Window("e0", "ttft_seconds", ENGINE, t, 60.0, "histogram", 4, delta=5.0,
                   p50=0.1, p90=_nan_at(m, 0.2), p99=math.pi, sum_delta=t / 7),
            Window("e0", "prefix_cache_hit_ratio", ENGINE, t, 60.0, "ratio", 4,
                   mean=_nan_at(m, 0.25), delta=100.0),
            Window("lm/ü", "lmcache_hit_tokens_total", ODD, t + 0.123456789, 60.0, "counter", 2,
                   delta=1.5),
            Window("lm/ü", "lmcache_healthy", (), t, 60.0, "gauge", 1, last=1.0),
        ]  # fmt: skip
    return out


def assert_frame_is_windows(frame: Any, windows: list[Window]) -> None:
    """Every row of the frame equals the Window at the same position, field by field."""
    assert len(frame) == len(windows)
    records = frame.to_dict("records")
    for row, w in zip(records, windows, strict=True):
        labels = tuple(sorted(json.loads(row["labels"]).items()))
        assert (row["source"], row["signal"], labels, row["kind"]) == (
            w.source, w.signal, w.labels, w.kind,
        )  # fmt: skip
        assert row["engine"] == dict(w.labels).get("engine") or (
            "engine" not in dict(w.labels) and isinstance(row["engine"], float)
        )
        assert row["model_name"] == dict(w.labels).get("model_name") or (
            "model_name" not in dict(w.labels) and isinstance(row["model_name"], float)
        )
        for name in ("start", "length_s", "samples", "resets"):
            assert row[name] == getattr(w, name), name
        for name in ("delta", "rate", "mean", "min", "max", "last", "p50", "p90", "p99",
                     "sum_delta"):  # fmt: skip
            value = getattr(w, name)
            if value is None:
                assert math.isnan(row[name]), name
            else:
                assert row[name] == value and math.copysign(1, row[name]) == math.copysign(
                    1, value
                ), name


def test_read_frame_mixed_equals_read_windows_field_by_field(store: Store) -> None:
    rows = mixed()
    store.write_windows(reversed(rows))
    windows = store.read_windows()
    frame = store.read_frame()
    assert tuple(frame.columns) == FRAME_COLUMNS
    assert_frame_is_windows(frame, windows)
    pd.testing.assert_frame_equal(frame, windows_frame(windows))
    unordered = store.read_frame(ordered=False)
    pd.testing.assert_frame_equal(
        unordered.sort_values(["source", "signal", "start", "labels"], ignore_index=True),
        frame.sort_values(["source", "signal", "start", "labels"], ignore_index=True),
    )


@pytest.mark.parametrize(
    "filters",
    [
        {"signals": ["kv_cache_usage_ratio"]},  # few rows of many: the index
        {"signals": ["kv_cache_usage_ratio", "ttft_seconds", "preemptions_total",
                     "request_success_total", "prefix_cache_hit_ratio",
                     "lmcache_hit_tokens_total", "lmcache_healthy"]},  # most rows: a scan
        {"sources": ["e0", "nope"]},
        {"sources": ["e0", "e1", "lm/ü"], "since": T0 + 60},
        {"cluster": "east"},
        {"cluster": "nowhere"},
        {"since": T0 + 60, "until": T0 + 180},
        {"signals": ["ttft_seconds"], "sources": ["e0"], "since": T0 + 120},
        {"signals": []},
    ],
)  # fmt: skip
def test_read_frame_filters_select_read_windows_rows(store: Store, filters: dict[str, Any]) -> None:
    store.write_windows(mixed())
    store.upsert_target("e0", "http://10.0.0.1:8000/metrics", cluster="east")
    store.upsert_engine("east", "lm/ü", model="llama")
    windows = store.read_windows(**filters)
    assert_frame_is_windows(store.read_frame(**filters), windows)


def test_read_frame_columns_subset_in_frame_order(store: Store) -> None:
    store.write_windows(mixed())
    frame = store.read_frame(columns=["p90", "engine", "source", "start"], signals=["ttft_seconds"])
    assert list(frame.columns) == ["source", "engine", "start", "p90"]
    assert frame["p90"].isna().sum() == 1 and set(frame["engine"]) == {"0"}
    with pytest.raises(StoreError, match=r"unknown frame column\(s\) \['bogus'\]"):
        store.read_frame(columns=["start", "bogus"])


@pytest.mark.parametrize("columns", [None, ["source", "engine", "start", "samples", "mean"]])
def test_read_frame_empty_has_columns_and_dtypes(store: Store, columns: list[str] | None) -> None:
    empty = store.read_frame(columns=columns)
    store.write_windows(mixed())
    none = store.read_frame(columns=columns, signals=["nope"])
    full = store.read_frame(columns=columns)
    for frame in (empty, none):
        assert len(frame) == 0
        assert list(frame.columns) == list(full.columns) == list(columns or FRAME_COLUMNS)
        for name in frame.columns:
            want = "category" if name in CATEGORY_COLUMNS else (
                "int64" if name in ("samples", "resets") else "float64"
            )  # fmt: skip
            assert str(frame[name].dtype) == str(full[name].dtype) == want, name


def test_read_frame_unmigrated_refused_with_hint(db_url: str) -> None:
    with Store(db_url) as s, pytest.raises(StoreError, match="kvscope db migrate"):
        s.read_frame()


def test_read_frame_in_memory_sqlite() -> None:
    with Store("sqlite://") as s:
        s.migrate()
        s.write_windows(mixed())
        assert_frame_is_windows(s.read_frame(), s.read_windows())


def test_read_frame_kind_outside_the_four_kept_per_series(store: Store) -> None:
    odd = [win(start=T0 + 60 * i, mean=float(i)) for i in range(3)]
    odd += [Window("e9", "custom_total", ENGINE, T0, 60.0, "summary", 1, delta=1.0)]  # type: ignore[arg-type]
    store.write_windows(odd)
    frame = store.read_frame(columns=["source", "kind", "start", "mean", "delta"])
    assert list(frame["kind"]) == ["gauge", "gauge", "gauge", "summary"]
    assert_frame_is_windows(store.read_frame(), store.read_windows())


def test_fresh_sqlite_file_opened_by_many_at_once(tmp_path: Path) -> None:
    # Two collectors (or a collector and `kvscope plan`) starting together on a new file:
    # each switches it to WAL, which SQLite refuses at once ("database is locked") rather
    # than waiting, while another connection holds the lock. Before the retry, about one
    # round in seven lost a connection here.
    for i in range(25):
        url = f"sqlite:///{tmp_path}/db{i}/kvscope.db"
        barrier = threading.Barrier(4, timeout=60)
        errors: list[BaseException] = []

        def opener(
            url: str = url,
            barrier: threading.Barrier = barrier,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                barrier.wait()
                with Store(url) as s:
                    s.migrate()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=opener, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == [], (i, errors)
