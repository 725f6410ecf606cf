"""Serve a simulated cluster's live metrics: one ``/metrics`` per engine and per LMCache pool.

``serve_scenario(scenario, "HOST:PORT", speed=…)`` runs the simulation in scaled real time;
engine i answers on ``port + i``, LMCache pool j on ``port + n_engines + j``, always in text
format 0.0.4. The endpoints are announced as one JSON line on stdout (and in ``ports_file``).
Without ``loop`` the final values are served until SIGINT/SIGTERM; with it the workload
repeats and counters only grow. Memory stays bounded however long it runs.

Design, and the announcement's shape: planner/simulate/METHODS.md#metrics_server
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, Literal

from core.errors import ConfigError
from planner.simulate.cluster import Simulation
from planner.simulate.exposition import CONTENT_TYPE, engine_config, engine_view, pool_view, render
from planner.simulate.scenario import Scenario

METRICS_PATH = "/metrics"
TICK_S = 0.1  # wall seconds between simulation advances
MAX_SLICE_WALL_S = 0.05  # hold the lock at most about this long per slice when catching up


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One served ``/metrics``: an engine or an LMCache pool."""

    kind: Literal["engine", "lmcache"]
    index: int
    url: str
    node: int = 0
    offload: str = "none"
    pool: int | None = None  # engines: their LMCache pool
    scope: str = ""  # pools: engine | node | cluster
    engines: tuple[int, ...] = ()  # pools: member engines
    switching: bool = False  # engines: a switchback canary (its offload changes over time)


class LiveCluster:
    """A simulation advanced in scaled real time, shared by the HTTP threads."""

    def __init__(self, scenario: Scenario, speed: float, *, loop: bool = False) -> None:
        if not speed > 0:
            raise ConfigError(f"--speed must be > 0, got {speed:g}")
        self.scenario = scenario
        self.speed = speed
        self.loop = loop
        self.sim = Simulation(scenario, loop=loop, retain_requests=False)
        self.lock = threading.Lock()
        self.model_name = scenario.cluster.model.name
        self.engine_config = engine_config(scenario)
        l2 = scenario.cluster.lmcache.l2
        self._l2_name = l2.name if l2 is not None else ""
        self._wall0 = time.monotonic()
        self.lag_s = 0.0  # simulated seconds behind the wall clock after the last tick

    @property
    def n_engines(self) -> int:
        return len(self.sim.engines)

    @property
    def n_pools(self) -> int:
        return len(self.sim.pools)

    def target_time(self) -> float:
        return (time.monotonic() - self._wall0) * self.speed

    def tick(self) -> None:
        """Advance towards the wall clock in slices, releasing the lock between slices."""
        target = min(self.target_time(), self.sim.end_time)
        step = max(self.speed * MAX_SLICE_WALL_S, 1e-3)
        while True:
            with self.lock:
                now = self.sim.now
                if now >= target:
                    break
                self.sim.advance_to(min(target, now + step), settle=True)
        self.lag_s = max(0.0, min(self.target_time(), self.sim.end_time) - self.sim.now)

    @property
    def finished(self) -> bool:
        return self.sim.now >= self.sim.end_time

    def engine_body(self, i: int) -> bytes:
        with self.lock:
            snap = self.sim.engines[i].snapshot(self.sim.now)
        return render(engine_view(snap, self.engine_config))

    def pool_body(self, j: int) -> bytes:
        with self.lock:
            pool = self.sim.lmcache_snapshots()[j]
        return render(pool_view(pool, self.model_name, self._l2_name))


class _Handler(BaseHTTPRequestHandler):
    server: _MetricsServer
    protocol_version = "HTTP/1.1"
    timeout = 120.0  # an idle keep-alive connection is closed after this many seconds

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != METRICS_PATH:
            self._send(404, b"404 page not found\n")
            return
        try:
            body = self.server.body()
        except Exception as exc:  # a request boundary: answer 500, keep serving
            self._send(500, f"render failed: {type(exc).__name__}: {exc}\n".encode())
            return
        self._send(200, body)

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per scrape would drown the progress output."""


class _MetricsServer(ThreadingHTTPServer):
    """One endpoint. Keeps its open (keep-alive) connections so close() can end them: a
    handler thread would otherwise go on answering on its connection after shutdown."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], body: Callable[[], bytes]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self._conns: set[Any] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)
        self.body = body

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{METRICS_PATH}"


class ClusterServer:
    """The HTTP side: one server per endpoint, started and stopped together."""

    def __init__(self, live: LiveCluster, host: str, port: int) -> None:
        self.live = live
        self.servers: list[_MetricsServer] = []
        self.endpoints: list[Endpoint] = []
        self._threads: list[threading.Thread] = []
        sim = live.sim
        pool_of = {e: p.idx for p in sim.pools for e in p.engines}
        sb = live.scenario.cluster.switchback
        canaries = sb.engines if sb is not None else ()
        try:
            for i, eng in enumerate(sim.engines):
                srv = self._bind(host, port, i, functools.partial(live.engine_body, i))
                self.endpoints.append(Endpoint("engine", i, _url(host, srv.server_address[1]),
                                               node=eng.node, offload=eng.conn.mode,
                                               pool=pool_of.get(i),
                                               switching=i in canaries))  # fmt: skip
            for j, pool in enumerate(sim.pools):
                offset = len(sim.engines) + j
                srv = self._bind(host, port, offset, functools.partial(live.pool_body, j))
                node = sim.engines[min(pool.engines)].node  # scope cluster: node of engine 0
                self.endpoints.append(Endpoint("lmcache", j, _url(host, srv.server_address[1]),
                                               node=node, scope=pool.scope,
                                               engines=pool.engines))  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _bind(self, host: str, port: int, offset: int, body: Callable[[], bytes]) -> _MetricsServer:
        wanted = port + offset if port else 0
        if wanted > 65535:
            raise ConfigError(f"--serve {host}:{port}: endpoint {offset} would need port {wanted}")
        try:
            srv = _MetricsServer((host, wanted), body)
        except OSError as exc:
            raise ConfigError(
                f"--serve {host}:{port}: cannot listen on {host}:{wanted} "
                f"(endpoint {offset}): {exc.strerror or exc}"
            ) from None
        self.servers.append(srv)
        return srv

    def start(self) -> None:
        for srv in self.servers:
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1},
                                 name=f"metrics-{srv.server_address[1]}", daemon=True)  # fmt: skip
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        """Stop every serve loop (shutdown() waits for it), then close the sockets."""
        # shutdown() waits up to one poll interval for its loop: stop them all at once
        stoppers = [threading.Thread(target=srv.shutdown)
                    for srv, _ in zip(self.servers, self._threads, strict=False)]  # fmt: skip
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        for srv in self.servers:
            srv.server_close()
            srv.drop_connections()
        for t in self._threads:
            t.join(timeout=5)
        self.servers.clear()
        self._threads.clear()

    def document(self) -> dict[str, Any]:
        """The endpoints announcement (METHODS.md#metrics_server)."""
        live = self.live
        sb = live.scenario.cluster.switchback
        doc: dict[str, Any] = {
            "engines": [
                {"engine": e.index, "node": e.node, "offload": e.offload, "lmcache": e.pool,
                 "url": e.url} | ({"switching": True} if e.switching else {})
                for e in self.endpoints if e.kind == "engine"
            ],
            "lmcache": [
                {"pool": e.index, "node": e.node, "scope": e.scope, "engines": list(e.engines),
                 "url": e.url}
                for e in self.endpoints if e.kind == "lmcache"
            ],
            "model_name": live.model_name,
            "speed": live.speed,
            "scenario": live.scenario.name,
            "duration_s": live.scenario.duration_s,
            "loop": live.loop,
        }  # fmt: skip
        if sb is not None:
            doc["switchback"] = {"engines": list(sb.engines), "mode": sb.mode,
                                 "block_s": sb.period_s, "seed": sb.seed}  # fmt: skip
        return doc


def file_sd(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The endpoints as a Prometheus ``file_sd_configs`` document (job label per kind)."""
    out: list[dict[str, Any]] = []
    pool_of = {e: f"sim-lmcache-{p['pool']}" for p in doc["lmcache"] for e in p["engines"]}
    for kind, job in (("engines", "vllm"), ("lmcache", "lmcache")):
        for entry in doc[kind]:
            hostport = entry["url"].split("://", 1)[1].split("/", 1)[0]
            labels = {"job": job, "node": str(entry["node"])}
            if kind == "engines" and not entry.get("switching"):  # a canary's says itself
                labels["offload"] = entry["offload"]
            if kind == "engines" and entry["engine"] in pool_of:
                labels["pool"] = pool_of[entry["engine"]]
            out.append({"targets": [hostport], "labels": labels})
    return out


def targets_document(doc: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """The endpoints as a ``kvscope collect --targets`` file (collector/scrape.py format),
    with each engine's model, GPU, TP, offload mode and LMCache pool as the planner's
    metadata. A switchback canary's offload is left out: a configured mode wins over the
    exposed one (collector.engine_facts.describe), and the canary's changes with its
    restarts, so the collector reads it from the engine's cache_config_info at every scrape
    and records each change in the store's engine_changes at the scrape that first shows it."""
    spec = scenario.cluster
    pool_of = {e: f"sim-lmcache-{p['pool']}" for p in doc["lmcache"] for e in p["engines"]}
    targets: list[dict[str, Any]] = [
        {"name": f"sim-engine-{e['engine']}", "url": e["url"], "kind": "vllm",
         "engine": {"model": spec.model.name, "gpu": spec.gpu.name,
                    "tensor_parallel": spec.tensor_parallel}
                   | ({} if e.get("switching") else {"offload": e["offload"]})
                   | ({"pool": pool_of[e["engine"]]} if e["engine"] in pool_of else {})}
        for e in doc["engines"]
    ]  # fmt: skip
    targets += [
        {"name": f"sim-lmcache-{p['pool']}", "url": p["url"], "kind": "lmcache"}
        for p in doc["lmcache"]
    ]
    return {"cluster": f"sim-{scenario.name}", "targets": targets}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}") from None


def parse_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6) -> (host, port)."""
    host, sep, port_s = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_s.isdigit() or int(port_s) > 65535:
        raise ConfigError(f"--serve: expected HOST:PORT (e.g. 127.0.0.1:9100), got {value!r}")
    return host, int(port_s)


@contextlib.contextmanager
def _stop_on_sigterm(stop: threading.Event) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve_scenario(  # noqa: PLR0913 - keyword-only serving options (simulate --serve's flags)
    scenario: Scenario,
    address: str,
    *,
    speed: float = 1.0,
    loop: bool = False,
    ports_file: Path | None = None,
    targets_file: Path | None = None,
    file_sd_file: Path | None = None,
    stop: threading.Event | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int:
    """Serve ``scenario`` live on ``address`` (HOST:PORT) until SIGINT/SIGTERM or ``stop``;
    ``loop`` repeats its workload forever (METHODS.md#metrics_server).

    Prints the endpoints JSON line on ``out`` (stdout), progress on ``err`` (stderr);
    ``ports_file`` gets the same document, ``targets_file`` a ``kvscope collect --targets``
    file for the endpoints, ``file_sd_file`` a Prometheus ``file_sd_configs`` file (which
    ``kvscope collect --file-sd`` reads too). Returns the exit status (0).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    host, port = parse_address(address)
    stop = stop or threading.Event()
    live = LiveCluster(scenario, speed, loop=loop)
    server = ClusterServer(live, host, port)
    try:
        doc = server.document()
        if ports_file is not None:
            _write_atomic(ports_file, json.dumps(doc, indent=2) + "\n")
        if targets_file is not None:  # JSON is YAML: `kvscope collect --targets` reads it
            text = json.dumps(targets_document(doc, scenario), indent=2)
            _write_atomic(targets_file, text + "\n")
        if file_sd_file is not None:  # JSON: both Prometheus and kvscope read it by extension
            _write_atomic(file_sd_file, json.dumps(file_sd(doc), indent=2) + "\n")
        server.start()
        out.write(json.dumps(doc) + "\n")
        out.flush()
        looping = f", looping every {scenario.duration_s:g} simulated s" if loop else ""
        print(f"kvscope simulate: serving {live.n_engines} engine(s) and {live.n_pools} LMCache "
              f"pool(s) of {scenario.name!r} at {speed:g}x{looping}; Ctrl-C to stop",
              file=err)  # fmt: skip
        with _stop_on_sigterm(stop):
            _loop(live, stop, err)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    print(f"kvscope simulate: stopped at simulated t={live.sim.now:.1f} s", file=err)
    return 0


def _loop(live: LiveCluster, stop: threading.Event, err: IO[str]) -> None:
    warned_lag = announced_end = False
    loops = 0
    while not stop.wait(TICK_S):
        live.tick()
        if live.sim.loop_index != loops:
            loops = live.sim.loop_index
            print(f"kvscope simulate: loop {loops + 1} began (simulated "
                  f"t={loops * live.scenario.duration_s:g} s)", file=err, flush=True)  # fmt: skip
        if not warned_lag and live.lag_s > max(5.0, 2 * live.speed):
            warned_lag = True
            print(f"kvscope simulate: the simulation runs {live.lag_s:.1f} simulated s behind "
                  f"the clock; lower --speed", file=err)  # fmt: skip
        if live.finished and not announced_end:
            announced_end = True
            print(f"kvscope simulate: reached duration_s={live.sim.end_time:g}; serving the "
                  "final values until stopped", file=err)  # fmt: skip
