"""collector.file_sd: Prometheus file_sd documents, the files re-read when they change, and the
collect loop scraping their targets (real HTTP targets on 127.0.0.1, a real SQLite store).

Loop tests change the files from the loop's progress hook, so "the next tick" is counted in
ticks, not seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.file_sd import FileSD, check_pattern, load_file_sd, parse_file_sd
from collector.run import CollectStats, DirectParts, StoreTargets, collect_direct
from collector.run_config import DirectConfig
from collector.scrape import EngineMeta, Target, TargetSet
from collector.urlguard import URLPolicy
from core.errors import ConfigError
from planner.simulate.metrics_server import file_sd as simulated_file_sd
from store.store import Store
from tests.collector.exposerver import bumping, expo_server

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
V033 = (METRICS / "vllm-0.33.0-metrics-default.txt").read_text()
LMCACHE = (METRICS / "lmcache-0.5.6-legacy-metrics.txt").read_text()
LOOPBACK_OK = URLPolicy(allow=("127.0.0.1/32",))


def _one(path: str, text: str) -> list[tuple[str, str, str, str, EngineMeta | None]]:
    return [
        (d.target.name, d.target.url, d.target.kind, d.cluster, d.target.engine)
        for d in parse_file_sd(text, path=path, cluster="dflt")
    ]


# --------------------------------------------------------------------------- documents

MALFORMED = [
    # (file name, text, the error's fragment)
    ("f.yaml", "{targets: [h:1]}", "f.yaml: expected a list of target groups"),
    ("f.json", '{"targets": ["h:1"]}', "f.json: expected a list of target groups ({targets: "
     "[host:port, ...], labels: {...}}), got a mapping"),
    ("f.json", '"h:1"', "f.json: expected a list of target groups ({targets: [host:port, ...], "
     "labels: {...}}), got the string 'h:1'"),
    ("f.yaml", "- h:1", "f.yaml:1: group [0]: expected a mapping (targets, labels), got the "
     "string 'h:1'"),
    ("f.json", '[{"targets": ["h:1"]}, null]', "f.json: group [1]: expected a mapping "
     "(targets, labels), got null"),
    ("f.yaml", "- targets: [h:1]\n- [h:2]", "f.yaml:2: group [1]: expected a mapping"),
    ("f.yaml", "- targets: h:1", "f.yaml:1: group [0]: 'targets' must be a list of host:port "
     "strings, got the string 'h:1'"),
    ("f.json", '[{"targets": "h:1"}]', "f.json: group [0]: 'targets' must be a list"),
    ("f.json", '[{"targets": ["h:1", 9100]}]', "f.json: group [0] targets[1]: expected a "
     "host:port string, got the int 9100"),
    ("f.yaml", "- targets: [{h: 1}]", "group [0] targets[0]: expected a host:port string, got "
     "a mapping"),
    ("f.yaml", "- targets: ['http://h:1']", "f.yaml:1: group [0] targets[0]: 'http://h:1' is "
     "not a valid address: expected host:port"),
    ("f.yaml", "- targets: ['h:1/metrics']", "'h:1/metrics' is not a valid address"),
    ("f.yaml", "- targets: [h:1, 'h 2:1']", "group [0] targets[1]: 'h 2:1' is not a valid"),
    ("f.yaml", "- targets: ['h:99999']", "'h:99999' is not a valid address"),
    ("f.yaml", "- targets: ['h:0']", "'h:0' is not a valid address"),
    ("f.yaml", "- targets: ['h:x']", "'h:x' is not a valid address"),
    ("f.yaml", "- targets: ['h:']", "'h:' is not a valid address"),
    ("f.yaml", "- targets: ['user@h:1']", "'user@h:1' is not a valid address"),
    ("f.yaml", "- targets: ['']", "group [0] targets[0]: empty address"),
    ("f.json", '[{"targets": ["h:1"], "labels": ["a"]}]', "f.json: group [0]: 'labels' must "
     "be a mapping of names to string values, got a list"),
    ("f.json", '[{"targets": ["h:1"], "labels": {"node": 0}}]', "f.json: group [0]: label "
     "'node' must be a string, got the int 0"),
    ("f.json", '[{"targets": ["h:1"], "labels": {"up": true}}]', "label 'up' must be a "
     "string, got the bool True"),
    ("f.yaml", "- labels: {node: {rack: 1}}", "label 'node' must be a string, got a mapping"),
    ("f.yaml", "- labels: {team-a: x}", "f.yaml:1: group [0]: 'team-a' is not a valid label "
     "name ([a-zA-Z_][a-zA-Z0-9_]*)"),
    ("f.json", '[{"labels": {"0x": "y"}}]', "f.json: group [0]: '0x' is not a valid label"),
    ("f.json", '[{"targets": ["h:1"], "labels": {"x": "\\ud800"}}]', "f.json: group [0]: "
     "label 'x': '\\ud800' is not valid UTF-8"),
    ("f.yaml", "- labels: {a: x, a: y}", "f.yaml:1: key 'a' given twice"),
    ("f.yaml", "- targets: [h:1]\n  targets: [h:2]", "f.yaml:2: key 'targets' given twice"),
    ("f.yaml", "- targets: [h:1]\n  label: {a: b}", "f.yaml:1: group [0]: unknown key 'label': "
     "a group has targets and labels"),
    ("f.yaml", "- {targets: [h:1], labels: {__scheme__: ftp}}", "group [0]: label "
     "'__scheme__' must be http or https, got 'ftp'"),
    ("f.yaml", "- {targets: [h:1], labels: {kind: tgi}}", "group [0]: label 'kind' must be one "
     "of vllm, lmcache, got 'tgi'"),
    ("f.yaml", "- {targets: [h:1]}\n- {targets: [h:2], labels: {tensor_parallel: two}}",
     "f.yaml:2: group [1]: label 'tensor_parallel' must be an integer >= 1, got 'two'"),
    ("f.yaml", "- {targets: [h:1], labels: {tensor_parallel: 0}}", "'tensor_parallel' must be "
     "an integer >= 1, got '0'"),
    ("f.yaml", "- {targets: [h:1], labels: {tensor_parallel: 1.5}}", "got '1.5'"),
    ("f.yaml", "- {targets: [h:1], labels: {tensor_parallel: -2}}", "got '-2'"),
    ("f.json", '[{"targets": ["h:1"], "labels": {"tensor_parallel": 2}}]', "label "
     "'tensor_parallel' must be a string, got the int 2"),  # JSON wants strings (Prometheus)
    ("f.yaml", "- {targets: [h:1], labels: {offload: cpu}}", "group [0]: label 'offload' must "
     "be one of none, native, lmcache, got 'cpu'"),
    ("f.yaml", "- {targets: [h:1], labels: {model: '  '}}", "group [0]: label 'model' must be "
     "a non-empty string, got '  '"),
    ("f.yaml", f"- {{targets: [h:1], labels: {{cluster: {'c' * 201}}}}}", "group [0]: label "
     "'cluster' is longer than 200 characters"),
    ("f.yaml", f"- {{targets: [h:1], labels: {{instance: {'i' * 501}}}}}", "group [0] "
     "targets[0]: target name 'iiii"),
    ("f.json", '[{"targets": ["h:1"],}]', "f.json:1: invalid JSON: Expecting property name"),
    ("f.json", "", "f.json:1: invalid JSON: Expecting value"),  # Go's: unexpected end of input
    ("f.json", "- targets: [h:1]", "f.json:1: invalid JSON"),  # YAML is not read as JSON
    ("f.yaml", "- targets: [h:1\n", "f.yaml:2: invalid YAML: while parsing a flow "
     "sequence, expected ',' or ']'"),
    ("f.yaml", "- targets: []\n---\n- targets: []\n", "f.yaml:2: invalid YAML: expected a "
     "single document in the stream, but found another document"),
    ("f.txt", "[]", "f.txt: a file_sd file ends in .json, .yml or .yaml"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "text", "message"), MALFORMED)
def test_parse_file_sd_malformed_raises_config_error_naming_where(
    path: str, text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_file_sd(text, path=path, cluster="dflt")
    assert message in str(err.value)


H1 = ("h:1", "http://h:1/metrics", "vllm", "dflt", None)


@pytest.mark.parametrize(
    ("path", "text", "expected"),
    [
        ("f.yaml", "", []),  # an empty YAML file: no targets
        ("f.yaml", "# nothing yet\n", []),
        ("f.yml", "~", []),
        ("f.json", "null", []),
        ("f.json", "[]", []),
        ("f.yaml", "- targets: []\n- labels: {job: vllm}\n- {targets: ~, labels: ~}", []),
        ("f.yaml", "- targets: [h:1]", [H1]),
        ("f.YAML", "- targets: [h:1]", [H1]),  # the extension says YAML, in any case
        ("f.json", '[{"targets": ["h:1"], "labels": {}}]', [H1]),
        ("f.yaml", '[{"targets": ["h:1"], "labels": {}}]', [H1]),  # JSON is YAML too
        # Meta labels Prometheus uses elsewhere are ignored; a group's __address__ is
        # overridden by each target's; other labels are allowed and unused.
        ("f.yaml", "- targets: [h:1]\n  labels: {__meta_x: a, __scrape_interval__: 1s, "
         "__address__: 'other:2', __tmp_y: b, node: '0', env: prod}", [H1]),
        ("f.yaml", "- targets: ['h:1', '[::1]:9100']", [
            H1, ("[::1]:9100", "http://[::1]:9100/metrics", "vllm", "dflt", None)]),
        ("f.yaml", "- targets: [h]", [("h", "http://h/metrics", "vllm", "dflt", None)]),
        ("f.yaml", "- targets: [h:1]\n  labels: {__scheme__: https, __metrics_path__: x/m, "
         "__param_format: 'text plain', __param_a: '1', __param_: z}",
         [("h:1", "https://h:1/x/m?a=1&format=text+plain", "vllm", "dflt", None)]),
        ("f.yaml", "- targets: [h:1]\n  labels: {instance: engine-0, cluster: east}",
         [("engine-0", "http://h:1/metrics", "vllm", "east", None)]),
        # A label with an empty value is no label (Prometheus): defaults apply.
        ("f.yaml", "- targets: [h:1]\n  labels: {instance: '', kind: '', cluster: '', "
         "offload: ~, __scheme__: ''}", [H1]),
        ("f.yaml", "- targets: [h:1]\n  labels: {job: LMCache-pool}",
         [("h:1", "http://h:1/metrics", "lmcache", "dflt", None)]),
        ("f.yaml", "- targets: [h:1]\n  labels: {job: lmcache, kind: vllm}", [H1]),  # kind wins
        ("f.yaml", "- targets: [h:1]\n  labels: {job: node, kind: lmcache}",
         [("h:1", "http://h:1/metrics", "lmcache", "dflt", None)]),
        # YAML scalars are taken as written, as Prometheus' yaml.v2 does: 010 stays "010".
        ("f.yaml", "- targets: [h:1]\n  labels: {model: llama-3.1-8b, gpu: 010, "
         "tensor_parallel: 2, offload: native}",
         [("h:1", "http://h:1/metrics", "vllm", "dflt",
           EngineMeta(model="llama-3.1-8b", gpu="010", tensor_parallel=2, offload="native"))]),
        ("f.json", '[{"targets": ["h:1"], "labels": {"offload": "none"}}]',
         [("h:1", "http://h:1/metrics", "vllm", "dflt", EngineMeta(offload="none"))]),
    ],
)  # fmt: skip
def test_parse_file_sd_valid_gives_targets(
    path: str, text: str, expected: list[tuple[str, str, str, str, EngineMeta | None]]
) -> None:
    assert _one(path, text) == expected


def test_parse_file_sd_json_unknown_group_key_ignored_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="collector.file_sd"):
        got = _one("f.json", '[{"targets": ["h:1"], "label": {"job": "x"}}]')
    assert got == [H1]
    assert "f.json: group [0]: key(s) 'label' ignored" in caplog.text


def test_parse_file_sd_simulator_document_gives_engines_and_lmcache() -> None:
    doc: dict[str, list[dict[str, Any]]] = {
        "engines": [{"engine": i, "node": 0, "offload": "native", "lmcache": None,
                     "url": f"http://127.0.0.1:{9100 + i}/metrics"} for i in range(2)],
        "lmcache": [{"pool": 0, "node": 0, "scope": "node", "engines": [0, 1],
                     "url": "http://127.0.0.1:9102/metrics"}],
    }  # fmt: skip  # the endpoints document of `kvscope simulate --serve`
    got = parse_file_sd(json.dumps(simulated_file_sd(doc)), path="sim.json", cluster="sim")
    assert [(d.target.name, d.target.kind) for d in got] == [
        ("127.0.0.1:9100", "vllm"), ("127.0.0.1:9101", "vllm"), ("127.0.0.1:9102", "lmcache"),
    ]  # fmt: skip
    assert [d.target.url for d in got] == [e["url"] for e in doc["engines"] + doc["lmcache"]]
    assert got[0].target.engine == EngineMeta(offload="native", pool="sim-lmcache-0")


def test_load_file_sd_not_utf8_raises_config_error(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b'[{"targets": ["h\xff:1"]}]')
    with pytest.raises(ConfigError, match=r"f\.json: file_sd file is not UTF-8 \(byte 16\)"):
        load_file_sd(str(path), cluster="c")


@pytest.mark.parametrize(
    "pattern", ["sd/targets.json", "sd/*.json", "sd/vllm-*.yml", "/etc/sd/*-a*.YAML", "a.yaml"]
)
def test_check_pattern_prometheus_file_names_accepted(pattern: str) -> None:
    assert check_pattern(pattern) == pattern


@pytest.mark.parametrize(
    "pattern", ["sd/targets.txt", "sd/*", "sd/*/a.json", "sd*/a.json", "a.Json", "a.json.bak"]
)
def test_check_pattern_other_names_raise_config_error(pattern: str) -> None:
    with pytest.raises(ConfigError, match=r"must end in \.json, \.yml or \.yaml, with '\*' only"):
        check_pattern(pattern)


# --------------------------------------------------------------------------- watching


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, groups: list[dict[str, object]]) -> None:
    """Replace ``path`` atomically (a new inode), as configuration managers do."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)


def _names(sd: FileSD) -> list[str]:
    return [d.target.name for d in sd.targets]


def test_file_sd_poll_follows_replace_delete_create_and_new_glob_matches(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    sd = FileSD([str(tmp_path / "*.json")], cluster="c")
    assert sd.poll() == [] and _names(sd) == []  # nothing yet: created later
    _write(a, [{"targets": ["h:1"]}])
    assert sd.poll() == [] and _names(sd) == ["h:1"]
    _write(a, [{"targets": ["h:1", "h:2"]}])  # renamed over the old one
    sd.poll()
    assert _names(sd) == ["h:1", "h:2"]
    _write(b, [{"targets": ["h:3"]}])  # a new file the glob matches
    sd.poll()
    assert _names(sd) == ["h:1", "h:2", "h:3"] and sd.files() == {str(a): 2, str(b): 1}
    a.unlink()
    sd.poll()
    assert _names(sd) == ["h:3"] and sd.files() == {str(b): 1}


def test_file_sd_poll_unchanged_stat_not_reread_until_refresh(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("- targets: [h:1]\n")
    clock = _Clock()
    sd = FileSD([str(path)], cluster="c", refresh_s=300, monotonic=clock)
    sd.poll()
    before = path.stat()
    path.write_text("- targets: [h:2]\n")  # same size, same inode; the mtime put back
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    clock.now = 299.0
    sd.poll()
    assert _names(sd) == ["h:1"]  # stat unchanged: not parsed again
    clock.now = 300.0
    sd.poll()
    assert _names(sd) == ["h:2"]  # the refresh re-reads it anyway
    path.write_text("- targets: [h:3]\n")  # a new mtime
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1))
    sd.poll()
    assert _names(sd) == ["h:3"]


def test_file_sd_poll_broken_file_keeps_last_targets_error_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good, bad = tmp_path / "a.yaml", tmp_path / "b.yaml"
    good.write_text("- targets: [h:1, h:2]\n")
    bad.write_text("- labels: {tensor_parallel: two}\n  targets: [h:3]\n")
    clock = _Clock()
    sd = FileSD([str(tmp_path / "*.yaml")], cluster="c", monotonic=clock)
    with caplog.at_level(logging.ERROR, logger="collector.file_sd"):
        first = sd.poll()
        good.write_text("- targets: [h:1, h:2\n")  # corrupted
        second = sd.poll()
        (tmp_path / "c.yaml").write_text("- targets: [h:4]\n")  # the targets are merged again
        third = sd.poll()  # the broken files unchanged: not reported again
    assert first == [f"{bad}:1: group [0]: label 'tensor_parallel' must be an integer >= 1, "
                     "got 'two'"]  # fmt: skip
    assert len(second) == 1 and f"{good}:2: invalid YAML" in second[0] and third == []
    assert _names(sd) == ["h:1", "h:2", "h:4"]  # the corrupted file's last good read; none from b
    assert f"{bad}:1: group [0]: label 'tensor_parallel'" in caplog.text
    assert "no targets from it yet" in caplog.text
    assert "keeping the 2 target(s) of its last good read" in caplog.text
    clock.now = 301.0
    assert len(sd.poll()) == 2  # the refresh re-reads (and reports) both
    bad.write_text("- labels: {tensor_parallel: '2'}\n  targets: [h:3]\n")
    good.write_text("- targets: [h:1]\n")
    assert sd.poll() == [] and _names(sd) == ["h:1", "h:3", "h:4"]


def test_file_sd_poll_name_clash_first_wins_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(tmp_path / "a.json", [{"targets": ["h:1"], "labels": {"instance": "e0"}},
                                 {"targets": ["h:9"], "labels": {"instance": "own"}}])  # fmt: skip
    _write(tmp_path / "b.json", [{"targets": ["h:2", "h:2"], "labels": {"instance": "e0"}},
                                 {"targets": ["h:3"]}, {"targets": ["h:3"]}])  # fmt: skip
    sd = FileSD([str(tmp_path / "*.json")], cluster="c")
    with caplog.at_level(logging.WARNING, logger="collector.file_sd"):
        sd.poll(reserved={"own"})
        _write(tmp_path / "c.json", [{"targets": ["h:4"]}])  # re-merges; clashes not re-logged
        sd.poll(reserved={"own"})
    assert [(d.target.name, d.target.url) for d in sd.targets] == [
        ("e0", "http://h:1/metrics"), ("h:3", "http://h:3/metrics"), ("h:4", "http://h:4/metrics")
    ]  # fmt: skip
    clashes = [r.getMessage() for r in caplog.records if "is taken" in r.getMessage()]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert clashes == [
        f"file_sd: {a}: group [1] targets[0]: name 'own' is taken, the targets file's target "
        "of that name is scraped instead",
        f"file_sd: {b}: group [0] targets[0]: name 'e0' is taken, {a}: group [0] targets[0] is "
        "scraped instead",
        f"file_sd: {b}: group [0] targets[1]: name 'e0' is taken, {a}: group [0] targets[0] is "
        "scraped instead",
    ]  # identical h:3 entries are one target, not a clash


def test_file_sd_poll_unmatched_pattern_and_unreadable_file_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "dir.json").mkdir()  # matched by the glob, cannot be read
    sd = FileSD([str(tmp_path / "*.json"), str(tmp_path / "later.yaml")], cluster="c")
    with caplog.at_level(logging.WARNING, logger="collector.file_sd"):
        errors = sd.poll()
        sd.poll()
    assert errors == [f"{tmp_path / 'dir.json'}: cannot read file_sd file: Is a directory"]
    assert caplog.text.count(f"no file matches {tmp_path / 'later.yaml'} (yet)") == 1


def test_file_sd_no_pattern_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="no file name or pattern given"):
        FileSD([], cluster="c")


# --------------------------------------------------------------------------- the loop


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'kvscope.db'}") as s:
        s.migrate()
        yield s


def _collect(
    store: Store,
    sd: FileSD,
    at_tick: dict[int, Callable[[], object]],
    ticks: int,
    *,
    targets: TargetSet | None = None,
    source: StoreTargets | None = None,
) -> CollectStats:
    """Run ``ticks`` ticks of 0.1 s; after tick N (1-based), run ``at_tick[N]``."""
    done: set[int] = set()

    def progress(stats: CollectStats) -> None:
        if stats.ticks in at_tick and stats.ticks not in done:
            done.add(stats.ticks)
            at_tick[stats.ticks]()

    return asyncio.run(
        collect_direct(
            targets or TargetSet("file", ()),
            store,
            DirectConfig(
                interval_s=0.1,
                window_s=60.0,
                timeout_s=1.0,
                concurrency=4,
                max_body_bytes=1 << 20,
                max_ticks=ticks,
            ),
            DirectParts(progress=progress, store_targets=source, file_sd=sd),
        )
    )


def _group(base: str, path: str, **labels: str) -> dict[str, object]:
    return {"targets": [base.removeprefix("http://")],
            "labels": {"__metrics_path__": path, **labels}}  # fmt: skip


def test_collect_direct_file_sd_rewritten_next_tick_corrupt_kept_removed_stops(
    store: Store, tmp_path: Path
) -> None:
    sd_file = tmp_path / "sd" / "engines.json"
    sd_file.parent.mkdir()
    with expo_server() as srv:
        srv.add("/a", bumping(V033, "preemptions_total", 0, 1))
        srv.add("/b", V033)
        a = _group(srv.base, "/a", instance="a")
        b = _group(srv.base, "/b", instance="b", cluster="east")
        _write(sd_file, [a])
        sd = FileSD([str(tmp_path / "sd" / "*.json")], cluster="c")
        stats = _collect(
            store,
            sd,
            {
                2: lambda: _write(sd_file, [a, b]),  # b: scraped from tick 3
                4: lambda: sd_file.write_text('[{"targets": '),  # corrupt: a and b kept
                6: lambda: _write(sd_file, [b]),  # a: not scraped from tick 7
            },
            ticks=8,
        )
        hits = {p: srv.route(p).hits for p in ("/a", "/b")}
    assert stats.ticks == 8 and stats.failures == Counter()
    assert hits == {"/a": 6, "/b": 6}
    assert stats.file_sd_errors == 1 and stats.summary()["file_sd_errors"] == 1
    assert stats.last_error is not None
    assert stats.last_error.startswith(f"file_sd: {sd_file}:1: invalid JSON")
    assert len(store.outcomes(targets=["a"])) == 6 and len(store.outcomes(targets=["b"])) == 6
    # a's open windows were written when it went, not lost.
    pre = [w for w in store.read_windows(sources=["a"]) if w.signal == "preemptions_total"]
    assert sum(w.samples for w in pre) == 6
    assert [(t.name, t.cluster) for t in store.targets()] == [("a", "c"), ("b", "east")]


def test_collect_direct_file_sd_precedence_file_then_file_sd_then_store(
    store: Store, tmp_path: Path
) -> None:
    with expo_server() as srv:
        own = TargetSet("c", (Target("x", srv.add("/file-x", V033), "vllm"),))
        for route in ("/sd-x", "/sd-y", "/store-y", "/store-z"):
            srv.add(route, V033)
        store.upsert_target("y", srv.base + "/store-y", cluster="c")
        store.upsert_target("z", srv.base + "/store-z", cluster="c")
        docs = [[_group(srv.base, "/sd-x", instance="x"), _group(srv.base, "/sd-y", instance="y")],
                []]  # fmt: skip
        path = tmp_path / "sd.json"
        _write(path, docs[0])
        stats = _collect(
            store, FileSD([str(path)], cluster="c"), {3: lambda: _write(path, docs[1])}, ticks=5,
            targets=own, source=StoreTargets(LOOPBACK_OK),
        )  # fmt: skip
        never = {p: srv.route(p).hits for p in ("/sd-x", "/store-y")}
    # Counted in outcomes (one per scrape, up or not): a guarded store target's 90 ms deadline
    # can pass on a loaded machine before its request is sent.
    scrapes = {n: len(store.outcomes(targets=[n])) for n in ("x", "y", "z")}
    # x: the targets file's. y: file_sd's while listed (its registration replaced the store
    # row's URL); once gone from the file its own row is not scraped back from the store.
    assert stats.ticks == 5 and scrapes == {"x": 5, "y": 3, "z": 5}
    assert never == {"/sd-x": 0, "/store-y": 0}
    assert (store.targets()[1].name, store.targets()[1].url) == ("y", srv.base + "/sd-y")


def test_collect_direct_file_sd_targets_windows_and_engines_in_store(
    store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "cluster.yaml"
    with expo_server() as srv:
        srv.add("/metrics", bumping(V033, "preemptions_total", 10, 2))
        srv.add("/lmcache", LMCACHE)
        host = srv.base.removeprefix("http://")
        path.write_text(
            f"- targets: ['{host}']\n"
            "  labels: {job: vllm, cluster: east, model: llama-3.1-8b, gpu: H100,\n"
            "           tensor_parallel: 2, offload: lmcache}\n"
            f"- targets: ['{host}']\n"
            "  labels: {job: lmcache, cluster: east, instance: pool-0,\n"
            "           __metrics_path__: /lmcache}\n"
        )
        stats = _collect(store, FileSD([str(path)], cluster="c"), {}, ticks=3)
    assert stats.targets_up == 2 and stats.failures == Counter() and stats.file_sd_errors == 0
    assert stats.windows_written > 0
    assert [(t.name, t.kind, t.cluster) for t in store.targets()] == [
        (host, "vllm", "east"), ("pool-0", "lmcache", "east")
    ]  # fmt: skip
    pre = [w for w in store.read_windows(sources=[host]) if w.signal == "preemptions_total"]
    assert sum(w.samples for w in pre) == 3 and sum(w.delta or 0 for w in pre) == 4
    assert {w.source for w in store.read_windows(sources=["pool-0"])} == {"pool-0"}
    (engine,) = store.engines(cluster="east")
    assert (engine.source, engine.model, engine.gpu, engine.tensor_parallel, engine.offload) == (
        host, "llama-3.1-8b", "H100", 2, "lmcache"
    )  # fmt: skip
