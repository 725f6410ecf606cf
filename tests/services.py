"""Real services for tests: a throwaway PostgreSQL 15 and Debian's Prometheus on 127.0.0.1.

Nothing here is mocked: the binaries are Debian's (installed by `make test`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PGBIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready after {timeout_s} s")
        time.sleep(0.05)


@contextmanager
def postgres() -> Iterator[str]:
    """Start PostgreSQL 15 in a temp dir (initdb refuses root: run as `postgres`); yield a URL."""
    if not (PGBIN / "initdb").exists():
        raise RuntimeError("PostgreSQL 15 is not installed: run `make test` (installs it)")
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-pg-"))
    shutil.chown(tmp, "postgres", "postgres")
    os.chmod(tmp, 0o700)
    port = free_port()
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [
            *as_pg,
            str(PGBIN / "initdb"),
            "-D",
            str(tmp / "data"),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
    )
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {tmp} -c fsync=off"
    subprocess.run(
        [
            *as_pg,
            str(PGBIN / "pg_ctl"),
            "-D",
            str(tmp / "data"),
            "-l",
            str(tmp / "pg.log"),
            "-w",
            "-o",
            opts,
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [
                *as_pg,
                str(PGBIN / "pg_ctl"),
                "-D",
                str(tmp / "data"),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _daemon(name: str, config_yaml: str, args: Callable[[Path, int], list[str]]) -> Iterator[str]:
    """Start Debian's ``name`` with ``config_yaml`` as ``TMP/name.yml`` and ``args(TMP,
    port)`` on a free loopback port; yield its URL once ``/-/ready`` answers (a daemon that
    does not come up fails with its log's tail); stop it and remove TMP at the end."""
    binary = shutil.which(name)
    if binary is None:
        raise RuntimeError(f"{name} is not installed: run `make test` (installs it)")
    tmp = Path(tempfile.mkdtemp(prefix=f"kvscope-{name}-"))
    (tmp / f"{name}.yml").write_text(config_yaml)
    port = free_port()
    log = (tmp / f"{name}.log").open("wb")
    proc = subprocess.Popen([binary, *args(tmp, port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            _wait_http(f"{url}/-/ready")
        except TimeoutError as exc:  # a bad config exits at once: say why
            tail = (tmp / f"{name}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} (exit {proc.poll()}): {exc}\n{tail}") from None
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def prometheus(config_yaml: str, extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    """Start Debian's Prometheus with the given config on a free loopback port; yield its URL."""
    with _daemon("prometheus", config_yaml, lambda tmp, port: [
        f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", *extra_args,
    ]) as url:  # fmt: skip
        yield url


@contextmanager
def alertmanager(config_yaml: str) -> Iterator[str]:
    """Start Debian's Alertmanager 0.25 with the given config on a free loopback port (no
    cluster gossip: ``--cluster.listen-address=``); yield its URL."""
    with _daemon("prometheus-alertmanager", config_yaml, lambda tmp, port: [
        f"--config.file={tmp / 'prometheus-alertmanager.yml'}",
        f"--storage.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]) as url:  # fmt: skip
        yield url


class PrometheusProcess:
    """A Prometheus that can be stopped and started again on the same port and TSDB
    directory (a restart: the new process replays the old one's WAL), for fault tests.
    Made by :func:`restartable_prometheus`; ``url`` stays the same across restarts."""

    def __init__(self, tmp: Path, port: int, extra_args: tuple[str, ...] = ()) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: run `make test` (installs it)")
        self._args = [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            *extra_args,
        ]
        self._log = tmp / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{port}"
        self.starts = 0

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start a process (the first, or a new one after :meth:`stop`); return once ready."""
        if self.running:
            raise RuntimeError("prometheus is already running")
        with self._log.open("ab") as log:
            self._proc = subprocess.Popen(self._args, stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1
        try:
            _wait_http(f"{self.url}/-/ready")
        except TimeoutError as exc:
            tail = self._log.read_text(errors="replace")[-2000:]
            self.stop()
            raise RuntimeError(f"prometheus did not get ready: {exc}\n{tail}") from None

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (a clean shutdown: the WAL is closed) or, with ``kill``, SIGKILL."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def restartable_prometheus(
    config_yaml: str, extra_args: tuple[str, ...] = ()
) -> Iterator[PrometheusProcess]:
    """Like :func:`prometheus`, but yield the process handle (``.url``, ``.stop()``,
    ``.start()``) so a test can restart it on the same port and TSDB directory."""
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-prom-"))
    (tmp / "prometheus.yml").write_text(config_yaml)
    prom = PrometheusProcess(tmp, free_port(), extra_args)
    try:
        prom.start()
        yield prom
    finally:
        prom.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class PgServer:
    """A throwaway PostgreSQL 15 that a test can stop and start again on the same data
    directory and port (an outage: connections refused meanwhile, nothing mocked)."""

    url: str
    port: int
    tmp: Path

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(PGBIN / "pg_ctl"), "-D",
             str(self.tmp / "data"), "-l", str(self.tmp / "pg.log"), "-w", *args],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip

    def stop(self) -> None:
        """A fast shutdown (sessions terminated, then the port is closed), as an operator's
        `systemctl stop postgresql` does; returns once it is down."""
        self._ctl("-m", "fast", "stop")

    def start(self) -> None:
        """Start it again on the same data and port; returns once it accepts connections."""
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.tmp} -c fsync=off"
        self._ctl("-o", opts, "start")

    def accepts(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            return s.connect_ex(("127.0.0.1", self.port)) == 0


@contextmanager
def postgres_server() -> Iterator[PgServer]:
    """Like :func:`postgres`, but yields a :class:`PgServer` the test can stop and start."""
    if not (PGBIN / "initdb").exists():
        raise RuntimeError("PostgreSQL 15 is not installed: run `make test` (installs it)")
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-pg-"))
    shutil.chown(tmp, "postgres", "postgres")
    os.chmod(tmp, 0o700)
    port = free_port()
    subprocess.run(
        ["runuser", "-u", "postgres", "--", str(PGBIN / "initdb"), "-D", str(tmp / "data"),
         "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = PgServer(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", port, tmp)
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            server._ctl("-m", "immediate", "stop")
        shutil.rmtree(tmp, ignore_errors=True)
