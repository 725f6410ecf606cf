"""collector.scrape: the targets file and scraping many real HTTP targets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import pytest

from collector import scrape
from collector.parse import read_exposition
from collector.scrape import (
    ACCEPT_HEADER,
    INLINE_PARSE_BYTES,
    MAX_REDIRECTS,
    EngineMeta,
    Target,
    load_targets,
    parse_targets,
    scrape_all,
)
from collector.urlguard import URLPolicy
from core.errors import ConfigError
from core.records import ScrapeOutcome
from tests.collector.exposerver import bumping, expo_server
from tests.services import free_port

ROOT = Path(__file__).resolve().parents[2]
METRICS = ROOT / "tests" / "fixtures" / "metrics"
GOOD_FIXTURES = (
    "vllm-0.33.0-metrics-default.txt",
    "vllm-0.33.0-metrics-default-multiproc.txt",
    "vllm-0.11.0-metrics-default.txt",
    "vllm-0.33.0-metrics-full.txt",
    "lmcache-0.5.6-legacy-metrics.txt",
)
FULL = METRICS / "vllm-0.33.0-metrics-full.txt"
CAP = 200 * 1024  # above every fixture (the largest is 135 KB)
MALFORMED = b'# TYPE x counter\nx{engine="0" 1.0\nx 2\n'


# --------------------------------------------------------------------------- targets file


def test_load_targets_example_file_reads_every_entry() -> None:
    ts = load_targets(ROOT / "examples" / "targets.yaml")
    assert ts.cluster == "prod-a"
    assert [t.name for t in ts] == ["engine-0", "engine-1", "engine-70b-0", "lmcache-0"]
    assert ts.targets[0] == Target(
        name="engine-0",
        url="http://10.0.0.5:8000/metrics",
        kind="vllm",
        engine=EngineMeta(model="llama-3.1-8b", gpu="h100-80gb", tensor_parallel=1, offload="none"),
    )
    assert ts.targets[2].engine is not None and ts.targets[2].engine.tensor_parallel == 4
    assert ts.targets[3].kind == "lmcache" and ts.targets[3].engine is None


def test_load_targets_cluster_override_wins(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("cluster: a\ntargets:\n  - {name: e, url: 'http://h:1/metrics'}\n")
    assert load_targets(p, cluster="b").cluster == "b"
    assert load_targets(p).targets[0].kind == "vllm"  # the default kind


_OK = {"name": "e0", "url": "http://h:8000/metrics", "kind": "vllm"}

MALFORMED_TARGETS: list[tuple[object, str]] = [
    ([1, 2], "expected a mapping"),
    ({"targets": []}, "'targets' must be a non-empty list"),
    ({"cluster": "c"}, "'targets' must be a non-empty list"),
    ({"cluster": "", "targets": [_OK]}, "'cluster' must be a non-empty string"),
    ({"cluster": 3, "targets": [_OK]}, "'cluster' must be a non-empty string"),
    ({"targets": [_OK], "clusterr": "x"}, "unknown key(s) 'clusterr'"),
    ({"targets": ["http://h/metrics"]}, "targets[0]: expected a mapping"),
    ({"targets": [{"url": "http://h/metrics"}]}, "targets[0]: missing required key 'name'"),
    ({"targets": [{"name": "e"}]}, "targets[0] (e): missing required key 'url'"),
    ({"targets": [{"name": 5, "url": "http://h/m"}]}, "'name' must be a non-empty string"),
    ({"targets": [{**_OK, "url": "h:8000/metrics"}]}, "(e0): 'url' must be an http(s) URL"),
    ({"targets": [{**_OK, "url": "ftp://h/metrics"}]}, "'url' must be an http(s) URL"),
    ({"targets": [{**_OK, "kind": "sglang"}]}, "(e0): 'kind' must be one of vllm, lmcache"),
    ({"targets": [{**_OK, "interval": "5s"}]}, "(e0): unknown key(s) 'interval'"),
    (
        {"targets": [_OK, {**_OK, "url": "http://x/m"}]},
        "targets[1]: duplicate name 'e0' (also targets[0])",
    ),
    ({"targets": [{**_OK, "engine": "h100"}]}, "(e0).engine: expected a mapping"),
    ({"targets": [{**_OK, "engine": {"gpus": "h100"}}]}, ".engine: unknown key(s) 'gpus'"),
    ({"targets": [{**_OK, "engine": {"tensor_parallel": 0}}]}, "'tensor_parallel' must be"),
    ({"targets": [{**_OK, "engine": {"tensor_parallel": "2"}}]}, "'tensor_parallel' must be"),
    ({"targets": [{**_OK, "engine": {"tensor_parallel": True}}]}, "'tensor_parallel' must be"),
    ({"targets": [{**_OK, "engine": {"offload": "disk"}}]}, "'offload' must be one of"),
    ({"targets": [{**_OK, "engine": {"model": ""}}]}, "'model' must be a non-empty string"),
]


@pytest.mark.parametrize(("doc", "message"), MALFORMED_TARGETS)
def test_parse_targets_malformed_raises_config_error_naming_key(doc: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_targets(doc, source="t.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith("t.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("targets: [\n  {name: a\n", "t.yaml:"),  # YAML syntax error with a line number
        ("", "expected a mapping"),
        ("\xff\xfe", ""),
    ],
)
def test_load_targets_bad_file_raises_config_error(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "t.yaml"
    if text == "\xff\xfe":
        p.write_bytes(b"\xff\xfe\x00bad")
    else:
        p.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_targets(p)
    assert str(info.value).startswith(str(p)) and message in str(info.value)


def test_load_targets_missing_file_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read targets file"):
        load_targets(tmp_path / "absent.yaml")


# --------------------------------------------------------------------------- scraping


T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_scrape_all_mixed_targets_each_gets_its_outcome() -> None:
    with expo_server() as srv:
        targets = [
            Target(
                name=f"good-{i}", url=srv.add(f"/good{i}", (METRICS / f).read_bytes()), kind="vllm"
            )
            for i, f in enumerate(GOOD_FIXTURES)
        ]
        bad = {
            "slow": srv.add("/slow", b"x 1\n", delay_s=3.0),
            "err500": srv.add("/500", b"boom\n", status=500),
            "big": srv.add("/big", b"y 1\n" * 100_000, chunks=100),  # no Content-Length
            "big-declared": srv.add("/bigcl", b"y 1\n" * 100_000),
            "malformed": srv.add("/bad", MALFORMED),
            "binary": srv.add("/bin", b"\xff\xfe\xfa metric\n"),
            "bad-gzip": srv.add("/badgz", b"not gzip", headers={"Content-Encoding": "gzip"}),
            "gzip-bomb": srv.add(
                "/bomb", gzip.compress(b"# x\n" * 100_000), headers={"Content-Encoding": "gzip"}
            ),
            "good-gzip": srv.add(
                "/gz", gzip.compress(FULL.read_bytes()), headers={"Content-Encoding": "gzip"}
            ),
            "refused": f"http://127.0.0.1:{free_port()}/metrics",
            "missing": srv.base + "/nothing-here",
        }
        targets += [Target(name=n, url=u, kind="vllm") for n, u in bad.items()]
        t0 = time.perf_counter()
        results = _run(scrape_all(targets, timeout_s=0.5, concurrency=4, max_body_bytes=CAP))
        elapsed = time.perf_counter() - t0
        accepts = srv.route("/good0").accepts

    assert [r.target.name for r in results] == [t.name for t in targets]
    by = {r.target.name: r for r in results}
    for i in range(len(GOOD_FIXTURES)):
        r = by[f"good-{i}"]
        assert r.outcome.up, r.outcome
        assert r.snapshot is not None and r.snapshot.target == f"good-{i}"
        assert r.outcome.series == len(r.snapshot.samples) > 0
        assert r.outcome.bytes == (METRICS / GOOD_FIXTURES[i]).stat().st_size
        assert r.outcome.error_kind is None
    gz = by.pop("good-gzip")
    assert gz.outcome.up and gz.snapshot is not None
    assert gz.outcome.bytes == FULL.stat().st_size  # counted (and capped) decoded
    expected = {
        "slow": "timeout",
        "err500": "http_status",
        "big": "too_large",
        "big-declared": "too_large",
        "malformed": "parse",
        "binary": "parse",
        "bad-gzip": "parse",
        "gzip-bomb": "too_large",  # the cap applies to the decoded body
        "refused": "connect",
        "missing": "http_status",
    }
    assert {n: by[n].outcome.error_kind for n in expected} == expected
    for n in expected:
        assert not by[n].outcome.up and by[n].snapshot is None and by[n].outcome.error
    assert "500" in (by["err500"].outcome.error or "")
    assert "404" in (by["missing"].outcome.error or "")
    assert by["big"].outcome.bytes > CAP  # aborted just past the cap ...
    assert by["big"].outcome.bytes < 300_000  # ... not after reading the whole 400 KB body
    assert by["slow"].outcome.duration_s < 1.5
    assert elapsed < 2.5  # the slow target (3 s) was cut by its timeout
    assert accepts == [ACCEPT_HEADER]


def test_scrape_all_concurrency_bound_is_respected() -> None:
    text = (METRICS / "vllm-0.33.0-metrics-default.txt").read_bytes()
    with expo_server() as srv:
        targets = [
            Target(name=f"e{i}", url=srv.add(f"/e{i}", text, delay_s=0.1), kind="vllm")
            for i in range(8)
        ]
        results = _run(scrape_all(targets, timeout_s=2.0, concurrency=3, max_body_bytes=1 << 20))
        peak = srv.max_inflight
    assert all(r.outcome.up for r in results)
    assert 1 < peak <= 3


def test_scrape_all_timeout_excludes_wait_for_a_slot() -> None:
    # concurrency 1: the third target waits ~0.5 s for a slot, more than the 0.35 s timeout;
    # its own request takes 0.2 s, so it must be up (Prometheus times each scrape alone).
    with expo_server() as srv:
        targets = [
            Target(name=f"e{i}", url=srv.add(f"/e{i}", b"# nothing\n", delay_s=0.2), kind="vllm")
            for i in range(3)
        ]
        results = _run(scrape_all(targets, timeout_s=0.35, concurrency=1, max_body_bytes=1024))
    assert [r.outcome.up for r in results] == [True, True, True]
    assert results[2].outcome.started - results[0].outcome.started >= 0.35


def test_scrape_all_counter_moves_between_scrapes() -> None:
    text = (METRICS / "vllm-0.33.0-metrics-default.txt").read_text()
    with expo_server() as srv:
        t = Target(
            name="e0", url=srv.add("/m", bumping(text, "preemptions_total", 10, 5)), kind="vllm"
        )
        first = _run(scrape_all([t], timeout_s=1, concurrency=1, max_body_bytes=1 << 20))[0]
        second = _run(scrape_all([t], timeout_s=1, concurrency=1, max_body_bytes=1 << 20))[0]
    values = []
    for r in (first, second):
        assert r.snapshot is not None
        values.append([s.value for s in r.snapshot.samples if s.signal == "preemptions_total"])
    assert values == [[10.0], [15.0]]


class _Limits(TypedDict):
    """scrape_all's keyword limits, as the malformed-limits table spells them."""

    timeout_s: float
    concurrency: int
    max_body_bytes: int


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": 1.0, "concurrency": 0, "max_body_bytes": 10}, "concurrency"),
        ({"timeout_s": 0.0, "concurrency": 1, "max_body_bytes": 10}, "timeout"),
    ],
)
def test_scrape_all_bad_limits_raise_config_error(kwargs: _Limits, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _run(scrape_all([], **kwargs))


# --------------------------------------------------------------------------- redirects, guard

V033 = (METRICS / "vllm-0.33.0-metrics-default.txt").read_bytes()
LOOPBACK_OK = ("127.0.0.1/32",)


def _engine_test(host: str, _port: int) -> list[str]:
    """The injected resolver: engine.test is 127.0.0.1, nothing else resolves (no real DNS)."""
    if host == "engine.test":
        return ["127.0.0.1"]
    raise OSError(-2, "Name or service not known")


def _scrape(target: Target) -> ScrapeOutcome:
    (result,) = _run(scrape_all([target], timeout_s=2, concurrency=1, max_body_bytes=CAP))
    return result.outcome


@pytest.mark.parametrize("absolute", [False, True])
def test_scrape_one_same_origin_redirect_followed(absolute: bool) -> None:
    with expo_server() as srv:
        location = (srv.base if absolute else "") + "/metrics/"
        url = srv.add("/metrics", b"", status=307, headers={"Location": location})
        srv.add("/metrics/", V033)
        outcome = _scrape(Target("e0", url, "vllm"))
        hits = srv.route("/metrics/").hits
    assert outcome.up and outcome.series > 0 and hits == 1


# Where a target may try to send the collector; {port} is the test server's own port.
CROSS_HOST_REDIRECTS = [
    "http://localhost:{port}/elsewhere",  # the same server under another host name
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://[::ffff:169.254.169.254]/latest/meta-data/",
    "https://127.0.0.1:{port}/elsewhere",  # another scheme
    "http://127.0.0.1:{other}/elsewhere",  # another port
    "//localhost:{port}/elsewhere",  # scheme-relative
    "http://user@127.0.0.1:{port}/elsewhere",  # userinfo
]


@pytest.mark.parametrize("guarded", [False, True])
@pytest.mark.parametrize("location", CROSS_HOST_REDIRECTS)
def test_scrape_one_redirect_to_other_origin_not_followed(location: str, guarded: bool) -> None:
    with expo_server() as srv:
        port = srv.base.rsplit(":", 1)[1]
        where = location.format(port=port, other=free_port())
        url = srv.add("/metrics", b"", status=302, headers={"Location": where})
        srv.add("/elsewhere", V033)
        guard = URLPolicy(allow=LOOPBACK_OK) if guarded else None
        outcome = _scrape(Target("e0", url, "vllm", guard=guard))
        elsewhere = srv.route("/elsewhere").hits
    assert not outcome.up and outcome.error_kind == "redirect"
    assert "redirects are followed only on the target's own origin" in (outcome.error or "")
    assert elsewhere == 0


def test_scrape_one_redirect_loop_stops_after_max_redirects() -> None:
    with expo_server() as srv:
        url = srv.add("/metrics", b"", status=307, headers={"Location": "/metrics"})
        outcome = _scrape(Target("e0", url, "vllm"))
        hits = srv.route("/metrics").hits
    assert outcome.error_kind == "http_status" and f"more than {MAX_REDIRECTS}" in (
        outcome.error or ""
    )
    assert hits == MAX_REDIRECTS + 1


def test_scrape_one_guarded_target_connects_to_checked_address_with_host_header() -> None:
    with expo_server() as srv:
        port = srv.base.rsplit(":", 1)[1]
        srv.add("/metrics", b"", status=307, headers={"Location": f"http://engine.test:{port}/m/"})
        srv.add("/m/", V033)
        guard = URLPolicy(allow=LOOPBACK_OK, resolve=_engine_test)
        outcome = _scrape(Target("e0", f"http://engine.test:{port}/metrics", "vllm", guard=guard))
        hosts = srv.route("/metrics").hosts + srv.route("/m/").hosts
    assert outcome.up, outcome
    assert hosts == [f"engine.test:{port}"] * 2  # the redirect was re-pinned too


@pytest.mark.parametrize(
    ("url", "allow", "kind", "says"),
    [
        ("http://127.0.0.1:{port}/metrics", (), "refused",
         "loopback address 127.0.0.1 not allowed (allowlist it with --allow-network"),
        ("http://engine.test:{port}/metrics", (), "refused", "(from engine.test) not allowed"),
        ("http://0x7f.1:{port}/metrics", LOOPBACK_OK, "refused", "is ambiguous"),
        ("ftp://127.0.0.1:{port}/metrics", LOOPBACK_OK, "refused", "scheme 'ftp'"),
        ("http://nowhere.test:{port}/metrics", LOOPBACK_OK, "connect", "cannot resolve"),
    ],
)  # fmt: skip
def test_scrape_one_guarded_target_refused_never_connected(
    url: str, allow: tuple[str, ...], kind: str, says: str
) -> None:
    with expo_server() as srv:
        srv.add("/metrics", V033)
        guard = URLPolicy(allow=allow, resolve=_engine_test)
        target = Target("e0", url.format(port=srv.base.rsplit(":", 1)[1]), "vllm", guard=guard)
        outcome = _scrape(target)
        hits = srv.route("/metrics").hits
    assert not outcome.up and outcome.error_kind == kind and says in (outcome.error or "")
    assert hits == 0


def test_scrape_one_refused_address_literal_refused_whatever_the_timeout() -> None:
    """An address literal is judged before the first await: a tiny timeout (a loaded
    machine) still gives 'refused', never 'timeout'; a name waits for its lookup."""

    def slow(host: str, port: int) -> list[str]:
        time.sleep(0.2)
        return _engine_test(host, port)

    guard = URLPolicy(resolve=slow)
    literal = Target("e0", "http://127.0.0.1:9/metrics", "vllm", guard=guard)
    named = Target("e1", "http://engine.test:9/metrics", "vllm", guard=guard)
    results = _run(scrape_all([literal, named], timeout_s=1e-9, concurrency=2, max_body_bytes=CAP))
    assert [r.outcome.error_kind for r in results] == ["refused", "timeout"]


def test_a_large_exposition_is_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to INLINE_PARSE_BYTES on the loop's thread (no hand-off cost), beyond it in a
    worker thread (a federation-sized body must not stall the other scrapes)."""
    threads: dict[int, str] = {}
    real = read_exposition

    def spy(text: str, target: str, ts: float) -> Any:
        threads[len(text)] = threading.current_thread().name
        return real(text, target, ts)

    monkeypatch.setattr(scrape, "read_exposition", spy)
    small = V033
    big = V033 + b"".join(b"pad_%d 1\n" % i for i in range(INLINE_PARSE_BYTES // 8))
    assert len(small) <= INLINE_PARSE_BYTES < len(big)
    with expo_server() as srv:
        targets = [
            Target("small", srv.add("/s", small), "vllm"),
            Target("big", srv.add("/b", big), "vllm"),
        ]
        results = _run(
            scrape_all(targets, timeout_s=10, concurrency=2, max_body_bytes=len(big) + 1)
        )
    assert all(r.outcome.up for r in results), [r.outcome for r in results]
    loop_thread = threading.main_thread().name
    assert threads[len(small)] == loop_thread
    assert threads[len(big)] != loop_thread
