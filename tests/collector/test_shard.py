"""collector.shard and store.handoff: N collectors split the targets as Prometheus'
hashmod does, each target on exactly one, and re-sharding loses and duplicates nothing."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
import requests
import yaml

from collector.checkpoint import Saved
from collector.rollup import Rollup
from collector.run import CollectStats, collect_direct
from collector.run_config import DirectConfig
from collector.scrape import Target, TargetSet
from collector.shard import Shard, hashmod
from core.errors import ConfigError
from core.records import Snapshot
from store.store import Store
from tests import services
from tests.clirun import run_kvscope
from tests.collector.exposerver import ExpoServer, bumping, expo_server

ENGINE = (
    "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
    "# TYPE vllm:num_preemptions_total counter\n"
    'vllm:num_preemptions_total{engine="0",model_name="m"} 0\n'
)
STEP = 3.0  # the counter's increase per scrape
TICKS = 6  # per phase, 0.25 s apart: each phase spans at least one window boundary (1 s windows)


# ---- Shard ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "must be I/N"),
        ("1", "must be I/N"),
        ("a/b", "must be I/N"),
        ("1/2/3", "must be I/N"),
        ("-1/2", "must be I/N"),
        ("0.5/2", "must be I/N"),
        ("2/2", "index must be 0..1 for 2 shard"),
        ("0/0", "count must be 1..10000"),
        ("0/10001", "count must be 1..10000"),
    ],
)
def test_shard_spec_malformed_refused_naming_it(spec: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        Shard.parse(spec)
    assert str(info.value).startswith("--shard")


def test_shard_spec_parsed() -> None:
    assert Shard.parse(" 1/3 ") == Shard(1, 3)
    assert str(Shard.parse("0/1")) == "0/1"


def test_every_name_on_exactly_one_shard_and_the_split_even() -> None:
    names = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(3000)]
    for n in (1, 2, 3, 7):
        owners = Counter(i for name in names for i in range(n) if Shard(i, n).owns(name))
        assert sum(owners.values()) == len(names)
        assert all(abs(c - len(names) / n) < 4 * math.sqrt(len(names) / n) for c in owners.values())


def test_hashmod_known_values() -> None:
    # md5("") = d41d8cd98f00b204 e9800998ecf8427e: the last 8 bytes, big-endian
    assert hashmod("", 2**64 - 1) == 0xE9800998ECF8427E % (2**64 - 1)
    assert hashmod("", 1000) == 0xE9800998ECF8427E % 1000


@pytest.mark.prometheus
def test_shards_are_the_ones_prometheus_hashmod_keeps() -> None:
    """Debian's Prometheus, one job per shard of 3 keeping ``hashmod(__address__) == I``: the
    targets each job keeps are exactly the names Shard(I, 3) owns."""
    addresses = [f"127.0.0.{1 + i % 200}:{9000 + i}" for i in range(60)]
    jobs = [
        {
            "job_name": f"shard{i}",
            "scrape_interval": "1h",
            "static_configs": [{"targets": addresses}],
            "relabel_configs": [
                {
                    "source_labels": ["__address__"],
                    "modulus": 3,
                    "target_label": "__tmp_hash",
                    "action": "hashmod",
                },
                {"source_labels": ["__tmp_hash"], "regex": str(i), "action": "keep"},
            ],
        }
        for i in range(3)
    ]
    with services.prometheus(yaml.safe_dump({"scrape_configs": jobs})) as url:
        kept: dict[str, set[str]] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            active = requests.get(f"{url}/api/v1/targets", timeout=5).json()["data"]
            kept = {f"shard{i}": set() for i in range(3)}
            for t in active["activeTargets"]:
                kept[t["scrapePool"]].add(t["discoveredLabels"]["__address__"])
            if sum(map(len, kept.values())) == len(addresses):
                break
            time.sleep(0.2)
    for i in range(3):
        assert kept[f"shard{i}"] == {a for a in addresses if Shard(i, 3).owns(a)}, i
    assert all(kept.values())


# ---- hand-off through the store ----------------------------------------------------------------


def _state(name: str, ts: float) -> Saved:
    rollup = Rollup(name, 60.0)
    rollup.add(Snapshot(name, ts, ()))
    return Saved(name, f"http://{name}/metrics", ts, rollup.export_state())


def test_states_left_then_taken_once_newest_kept(db_url: str) -> None:
    with Store(db_url) as s:
        s.migrate()
        assert s.take_rollup_states(["e0"]) == {}
        assert s.leave_rollup_states([_state("e0", 1_000.0), _state("e1", 1_000.0)]) == 2
        # a later stop of e0's collector replaces its row; ±Infinity survives (histograms)
        newer = _state("e0", 1_060.0)
        newer.state["probe"] = [math.inf, -math.inf]
        s.leave_rollup_states([newer])
        got = s.take_rollup_states(["e0", "e9"])
        assert got == {"e0": newer}
        assert s.take_rollup_states(["e0"]) == {}  # taken: gone
        assert set(s.take_rollup_states(["e1"])) == {"e1"}


def test_state_taken_by_exactly_one_of_two_racing_collectors(db_url: str) -> None:
    names = [f"e{i}" for i in range(300)]
    with Store(db_url) as s:
        s.migrate()
        s.leave_rollup_states([_state(n, 1_000.0) for n in names])
    barrier = threading.Barrier(2, timeout=60)
    got: list[dict[str, Saved]] = []

    def taker() -> None:
        with Store(db_url) as s:
            barrier.wait()
            got.append(s.take_rollup_states(names))

    threads = [threading.Thread(target=taker, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(got) == 2
    assert not set(got[0]) & set(got[1])
    assert set(got[0]) | set(got[1]) == set(names)


# ---- sharded collectors -----------------------------------------------------------------------


def _targets(srv: ExpoServer, n: int) -> TargetSet:
    return TargetSet(
        "sharded",
        tuple(
            Target(
                f"engine-{i:02d}",
                srv.add(f"/engine-{i:02d}", bumping(ENGINE, "preemptions_total", 0, STEP)),
                "vllm",
            )
            for i in range(n)
        ),
    )


async def _fleet(targets: TargetSet, db: str, count: int, ticks: int) -> list[CollectStats]:
    """``count`` collectors, shards 0 … count-1, each with its own store connection and no
    state directory (as on separate hosts); all stopped after ``ticks`` ticks."""
    stores = [Store(db) for _ in range(count)]
    try:
        runs = [
            collect_direct(
                targets,
                stores[i],
                DirectConfig(
                    interval_s=0.25,
                    window_s=1.0,
                    timeout_s=5.0,
                    concurrency=16,
                    max_body_bytes=64 * 1024,
                    max_ticks=ticks,
                    shard=Shard(i, count),
                ),
            )
            for i in range(count)
        ]
        return list(await asyncio.gather(*runs))
    finally:
        for s in stores:
            s.close()


def _breaks(db: str, names: Sequence[str]) -> dict[str, int]:
    """Per target, how many windows do not carry on from the one before: a window's counter
    delta counts from the previous window's last sample, so last - delta equals the previous
    last unless an increase was lost (or counted twice)."""
    with Store(db) as s:
        windows = [w for w in s.read_windows() if w.signal == "preemptions_total"]
    out: dict[str, int] = {}
    for name in names:
        mine = sorted((w for w in windows if w.source == name), key=lambda w: w.start)
        assert mine, name
        out[name] = sum(
            1
            for a, b in itertools.pairwise(mine)
            if not math.isclose((b.last or 0.0) - (b.delta or 0.0), a.last or 0.0)
        )
    return out


@pytest.mark.parametrize(
    "handoff",
    [True, pytest.param(False, marks=pytest.mark.slow)],  # False: that it can fail
)
def test_two_shards_each_target_once_then_resharded_to_three_losing_nothing(
    db_url: str, handoff: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(db_url) as s:
        s.migrate()
    take = Store.take_rollup_states
    if not handoff:  # the same run without the store's hand-off: every target loses a delta
        monkeypatch.setattr(Store, "take_rollup_states", lambda self, names: {})
    with expo_server() as srv:
        targets = _targets(srv, 50)
        names = [t.name for t in targets]
        two = asyncio.run(_fleet(targets, db_url, 2, ticks=TICKS))
        hits_two = {n: srv.route(f"/{n}").hits for n in names}
        with Store(db_url) as s:
            per_target = Counter(o.target for o in s.outcomes())
            sampled = {o.target for o in s.outcomes() if o.up}  # a state worth taking over
            spans = Counter(w.source for w in s.read_windows(signals=["preemptions_total"]))
        three = asyncio.run(_fleet(targets, db_url, 3, ticks=TICKS))

    # exactly once: every target scraped by one collector of the two, once a tick
    assert sum(st.scrapes for st in two) == TICKS * 50
    assert per_target == {n: TICKS for n in names}
    assert all(h <= TICKS for h in hits_two.values()), hits_two
    assert sorted(len(Shard(i, 2).select(targets)) for i in range(2)) == sorted(
        st.scrapes // TICKS for st in two
    )
    assert sum(st.states_left for st in two) == 50
    # re-sharded: each state taken once by the target's new collector, nothing lost
    breaks = _breaks(db_url, names)
    if handoff:
        assert sum(st.states_taken for st in three) == len(sampled) >= 45
        assert breaks == {n: 0 for n in names}, {n: b for n, b in breaks.items() if b}
    else:
        assert sum(st.states_taken for st in three) == 0
        # the increase across the re-shard lost, seen where the first collector wrote two or
        # more windows (with one, the second collector's fuller version of it replaces it);
        # a first window of one sample, whose delta needs two, may show as a second break
        seen = {n for n in sampled if spans[n] >= 2}
        assert len(seen) >= 40 and all(breaks[n] >= 1 for n in seen), breaks
    with Store(db_url) as s:
        assert take(s, names).keys() == set(names)  # left again at the stop
        sources = {w.source for w in s.read_windows()}
    assert sources == set(names)


def test_collect_cli_shard_flag_checked(tmp_path: Path) -> None:
    targets = tmp_path / "t.yaml"
    one = {"name": "a", "url": "http://127.0.0.1:1/metrics"}
    targets.write_text(json.dumps({"cluster": "c", "targets": [one]}))
    db = f"sqlite:///{tmp_path / 'k.db'}"
    bad = run_kvscope("collect", "--targets", str(targets), "--db", db, "--shard", "3/3", "--once")
    assert bad.returncode == 2 and "--shard 3/3: shard index must be 0..2" in bad.stderr
    prom = run_kvscope("collect", "--prometheus", "http://127.0.0.1:1", "--db", db,
                       "--shard", "0/2")  # fmt: skip
    assert prom.returncode == 2 and "--shard splits scrape targets" in prom.stderr
    env = run_kvscope("collect", "--targets", str(targets), "--db", db, "--once",
                      env={"KVSCOPE_SHARD": "0/0"})  # fmt: skip
    assert env.returncode == 2 and "--shard 0/0: shard count must be 1..10000" in env.stderr
