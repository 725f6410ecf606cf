"""collector.checkpoint and Rollup.export_state/restore_state: a restart carries on exactly."""

from __future__ import annotations

import json
import marshal
import math
from pathlib import Path

import pytest

from collector.checkpoint import MAGIC, Checkpoints, Saved, resumable, state_dir_for
from collector.rollup import Rollup
from core.errors import ConfigError
from core.records import Labels, SignalSample, Snapshot, Window
from store.store import Store

ENGINE: Labels = (("engine", "0"), ("model_name", "m"))
BOUNDS = (0.1, 0.5, 1.0, math.inf)


def _snapshot(i: int) -> Snapshot:
    """Scrape ``i`` of an engine every 7 s: counters that move (and reset once), a gauge, a
    histogram whose buckets fill, and a series that appears later."""
    counts = (1.0 * i, 2.0 * i, 3.0 * i, 3.0 * i)
    samples = [
        SignalSample("preemptions_total", "counter", ENGINE, 5.0 * i if i < 20 else i - 20.0),
        SignalSample("prefix_cache_queries_total", "counter", ENGINE, 10.0 * i),
        SignalSample("prefix_cache_hits_total", "counter", ENGINE, 4.0 * i),
        SignalSample("kv_cache_usage_ratio", "gauge", ENGINE, (i % 5) / 5),
        SignalSample.histogram("ttft_seconds", ENGINE, counts[-1],
                               tuple(zip(BOUNDS, counts, strict=True)), 0.3 * i),
    ]  # fmt: skip
    if i >= 9:
        samples.append(SignalSample("requests_waiting", "gauge", ENGINE, float(i)))
    return Snapshot("e0", 1_000_003.0 + 7.0 * i, tuple(samples))


def _feed(rollup: Rollup, snapshots: list[Snapshot]) -> list[Window]:
    return [w for s in snapshots for w in rollup.add(s)]


@pytest.mark.parametrize("cut", [1, 4, 8, 9, 13, 20, 31])
def test_rollup_restored_state_carries_on_as_if_never_stopped(cut: int) -> None:
    snapshots = [_snapshot(i) for i in range(40)]
    whole = Rollup("e0", 60.0)
    expected = _feed(whole, snapshots) + whole.flush()
    before = Rollup("e0", 60.0)
    got = _feed(before, snapshots[:cut])
    saved = json.loads(json.dumps(before.export_state()))  # as the checkpoint file holds it
    after = Rollup("e0", 60.0)
    after.restore_state(saved)
    got += _feed(after, snapshots[cut:]) + after.flush()
    assert got == expected
    assert any(w.resets for w in got) and any(w.kind == "ratio" for w in got)


def test_rollup_restore_other_window_or_malformed_refused_unchanged() -> None:
    rollup = Rollup("e0", 60.0)
    rollup.add(_snapshot(0))
    state = rollup.export_state()
    with pytest.raises(ConfigError, match=r"window 60\.0 s, not 30 s"):
        Rollup("e0", 30.0).restore_state(state)
    target = Rollup("e0", 60.0)
    broken = {**state, "series": [["x", [], ["nonsense", 1, 2, None, [], []]]]}
    with pytest.raises(ValueError, match="unknown series kind"):
        target.restore_state(broken)
    assert target.last_timestamp is None and target.tracked_series == 0


def _saved(last_ts: float, *, url: str = "http://e0/metrics", window_s: float = 60.0) -> Saved:
    rollup = Rollup("e0", window_s)
    rollup.add(Snapshot("e0", last_ts, ()))
    return Saved("e0", url, last_ts, rollup.export_state())


@pytest.mark.parametrize(
    ("now", "url", "window_s", "expected"),
    [
        (1_000.0, "http://e0/metrics", 60.0, True),  # at once
        (1_300.0, "http://e0/metrics", 60.0, True),  # 5 windows later: the horizon
        (1_300.5, "http://e0/metrics", 60.0, False),  # past it: starts afresh
        (999.0, "http://e0/metrics", 60.0, False),  # the clock went back
        (1_010.0, "http://e1/metrics", 60.0, False),  # another engine now
        (1_010.0, "http://e0/metrics", 30.0, False),  # another window length
    ],
)
def test_resumable_horizon_url_window_clock(
    now: float, url: str, window_s: float, expected: bool
) -> None:
    saved = _saved(1_000.0)
    assert resumable(saved, url=url, now=now, window_s=window_s, stale_windows=5) is expected


def _states(*names: str) -> dict[str, tuple[str, dict[str, object]]]:
    out: dict[str, tuple[str, dict[str, object]]] = {}
    for name in names:
        rollup = Rollup(name, 60.0)
        rollup.add(Snapshot(name, 1_000.0, ()))
        out[name] = (f"http://{name}/metrics", rollup.export_state())
    return out


def test_checkpoints_running_collectors_left_alone_gone_ones_claimed_then_deleted(
    tmp_path: Path,
) -> None:
    running = Checkpoints(tmp_path, store_id="sqlite:///k.db")
    assert running.save(_states("e0", "e1"))
    with Checkpoints(tmp_path, store_id="sqlite:///k.db") as meanwhile:
        assert meanwhile.saved == {}  # its lock is held
    running.close()  # as its process ending (kill -9 included) lets go of the flock
    other_store = Checkpoints(tmp_path, store_id="sqlite:///other.db")
    assert other_store.saved == {}
    other_store.close(remove=True)
    restarted = Checkpoints(tmp_path, store_id="sqlite:///k.db")
    assert set(restarted.saved) == {"e0", "e1"}
    saved = restarted.claim("e0")
    assert saved is not None and saved.url == "http://e0/metrics" and saved.last_ts == 1_000.0
    assert restarted.claim("e0") is None  # once
    assert restarted.save(_states("e0"))
    assert running.path.exists()  # e1 was not claimed: left for whoever scrapes it
    restarted.close()
    with Checkpoints(tmp_path, store_id="sqlite:///k.db") as third:
        assert set(third.saved) == {"e0", "e1"}
        assert third.saved["e0"].written > third.saved["e1"].written  # the newest state of e0
        assert sorted(s.name for s in third.stale(now=1_000.0 + 301.0)) == ["e0", "e1"]
        assert third.save({})
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [third.path.name, third.path.with_suffix(".lock").name]


@pytest.mark.parametrize(
    "content",
    [
        b'{"kvscope_checkpoint": 1, "store": "sqlite:///k.db", "targ',  # cut-short JSON
        MAGIC + marshal.dumps({"kvscope_checkpoint": 2, "targets": {}})[:-3],  # cut short
        MAGIC + b"\xff\x00garbage",  # not marshal data
        MAGIC + marshal.dumps([1, 2, 3]),  # marshal, not a checkpoint
        MAGIC + marshal.dumps({"kvscope_checkpoint": 2, "store": "sqlite:///k.db"}),  # no targets
    ],
    ids=["json-cut", "marshal-cut", "garbage", "a-list", "no-targets"],
)
def test_checkpoints_unreadable_file_not_resumed_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    gone = Checkpoints(tmp_path, store_id="sqlite:///k.db")
    gone.save(_states("e0"))
    gone.close()
    gone.path.write_bytes(content)
    with Checkpoints(tmp_path, store_id="sqlite:///k.db") as restarted:
        assert restarted.saved == {}
    assert "is unreadable" in caplog.text


def test_checkpoint_file_is_marshal_and_an_earlier_json_one_is_still_resumed(
    tmp_path: Path,
) -> None:
    gone = Checkpoints(tmp_path, store_id="sqlite:///k.db")
    gone.save(_states("e0"))
    gone.close()
    raw = gone.path.read_bytes()
    assert gone.path.suffix == ".ckpt" and raw.startswith(MAGIC)
    data = marshal.loads(raw[len(MAGIC) :])
    # what kvscope before format 2 wrote: the same document as JSON, in rollup-….json
    data["kvscope_checkpoint"] = 1
    gone.path.unlink()
    legacy = gone.path.with_suffix(".json")
    legacy.write_text(json.dumps(data))
    with Checkpoints(tmp_path, store_id="sqlite:///k.db") as restarted:
        saved = restarted.claim("e0")
        assert saved is not None and saved.url == "http://e0/metrics"
        assert saved.state["last_ts"] == 1_000.0
        assert restarted.save({})  # every state claimed: the legacy file is deleted
    assert not legacy.exists()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:////data/kvscope.db", "/data/kvscope.db-state"),
        ("sqlite:///kvscope.db", "kvscope.db-state"),
        ("sqlite://", None),
        ("sqlite:///:memory:", None),
        ("postgresql+psycopg://kv:secret@db.internal:5432/kvscope",
         "/state/kvscope/postgresql-db.internal-5432-kvscope-"),
    ],
)  # fmt: skip
def test_state_dir_for_sqlite_beside_file_else_xdg_state(url: str, expected: str | None) -> None:
    found = state_dir_for(url, {"XDG_STATE_HOME": "/state", "HOME": "/home/u"})
    if expected is None or expected.endswith(".db-state"):
        assert (None if found is None else str(found)) == expected
    else:
        assert str(found).startswith(expected) and "secret" not in str(found)
        same_store_other_password = url.replace("secret", "changed")
        assert state_dir_for(same_store_other_password, {"XDG_STATE_HOME": "/state"}) == found
    assert str(state_dir_for("postgresql://db/k", {"HOME": "/home/u"})).startswith(
        "/home/u/.local/state/kvscope/postgresql-db-k-"
    )


def test_store_keep_fuller_partial_never_replaces_fuller_window(db_url: str) -> None:
    """What a restart without a checkpoint writes into the window it started in (its part
    only) leaves the fuller version stored; the same or a fuller one replaces it."""

    def window(samples: int, delta: float) -> Window:
        return Window("e0", "preemptions_total", ENGINE, 120.0, 60.0, "counter", samples,
                      delta=delta, last=100.0 + delta)  # fmt: skip

    with Store(db_url) as store:
        store.migrate()
        store.write_windows([window(4, 20.0)], keep_fuller=True)
        store.write_windows([window(2, 5.0)], keep_fuller=True)  # the partial one: kept out
        assert [(w.samples, w.delta) for w in store.read_windows()] == [(4, 20.0)]
        store.write_windows([window(4, 21.0)], keep_fuller=True)  # a replay: replaces
        store.write_windows([window(6, 30.0)], keep_fuller=True)  # resumed, fuller: replaces
        assert [(w.samples, w.delta) for w in store.read_windows()] == [(6, 30.0)]
        store.write_windows([window(1, 0.0)])  # the default upsert replaces whatever is there
        assert [(w.samples, w.delta) for w in store.read_windows()] == [(1, 0.0)]
