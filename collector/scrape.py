"""Direct scraping: the targets file and a bounded, concurrent scrape of every target.

As Prometheus does, each scrape of each target yields one ScrapeOutcome (``up`` or an
``error_kind``: connect, timeout, truncated, http_status, too_large, parse, redirect,
refused) and one bad target never stops the others. Redirects are followed only on the
target URL's scheme, host and port (at most MAX_REDIRECTS); a target with a ``guard`` is
checked by collector.urlguard at every scrape and connected to the checked address.

Design: collector/DESIGN.md#scrape
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast
from urllib.parse import urljoin, urlsplit

import httpx
import yaml

from collector.http1 import BodyCutShort, ConnectFailed, Connection, ProtocolError
from collector.parse import read_exposition
from collector.urlguard import CheckedURL, URLPolicy, pinned_address, same_origin
from core.errors import ConfigError, ParseError, URLRefused
from core.records import ScrapeOutcome, Snapshot

log = logging.getLogger(__name__)

TargetKind = Literal["vllm", "lmcache"]
OffloadMode = Literal["none", "native", "lmcache"]
TARGET_KINDS: tuple[TargetKind, ...] = ("vllm", "lmcache")
OFFLOAD_MODES: tuple[OffloadMode, ...] = ("none", "native", "lmcache")

# Ask for the classic text format: prometheus-client 0.23-0.26 rewrites `vllm:` to `vllm_`
# in sample names when OpenMetrics is negotiated without `escaping=allow-utf-8`
# (prometheus/client_python#1177; see tests/fixtures/metrics/README.md).
ACCEPT_HEADER = "text/plain;version=0.0.4"
# As Prometheus asks: gzip or nothing. The body is inflated here step by step: zlib's
# max_length keeps each step within the body cap (httpx inflates a whole network read at
# once before any size check: a 260 KB gzip bomb becomes a 67 MB chunk).
ACCEPT_ENCODING = "gzip"
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
USER_AGENT = "kvscope-collector"
REQUEST_HEADERS = {"Accept": ACCEPT_HEADER, "Accept-Encoding": ACCEPT_ENCODING}
REDIRECTS = (301, 302, 303, 307, 308)  # followed, same origin only
MAX_REDIRECTS = 5  # same-origin hops per scrape
INLINE_PARSE_BYTES = 256 * 1024  # larger bodies are parsed in a worker thread (scrape_one)

Clock = Callable[[], float]  # epoch seconds stamped on snapshots (time.time, or a simulated clock)


@dataclass(frozen=True, slots=True)
class EngineMeta:
    """What the operator knows about an engine that its /metrics does not say."""

    model: str | None = None
    gpu: str | None = None
    tensor_parallel: int | None = None  # None: not written (DCGM, engines.yaml, or assumed 1)
    # None: not written in targets.yaml; the collector reads it from the engine's own facts
    # (collector.engine_facts) instead of assuming "none".
    offload: OffloadMode | None = None
    # The LMCache pool (server) the engine shares with others, e.g. its node: engines of one
    # pool are one unit of evidence for the planner (planner/fit/units.py).
    pool: str | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """One scrape target (from the targets file, or registered in the store).

    ``guard``: None for the operator's targets file (connected as written); a URLPolicy for a
    target registered by someone else: its URL is checked at every scrape and the connection
    goes to the checked address (collector.urlguard).
    """

    name: str
    url: str
    kind: TargetKind
    engine: EngineMeta | None = None
    guard: URLPolicy | None = None


@dataclass(frozen=True, slots=True)
class TargetSet:
    """A validated targets file: a cluster name and its uniquely named targets."""

    cluster: str
    targets: tuple[Target, ...]

    def __iter__(self) -> Iterator[Target]:
        return iter(self.targets)

    def __len__(self) -> int:
        return len(self.targets)


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """One scrape of one target: its outcome, and the snapshot when it was up."""

    target: Target
    outcome: ScrapeOutcome
    snapshot: Snapshot | None = None


# --------------------------------------------------------------------------- targets file

_TOP_KEYS = {"cluster", "targets"}
_TARGET_KEYS = {"name", "url", "kind", "engine"}
_ENGINE_KEYS = {"model", "gpu", "tensor_parallel", "offload", "pool"}


def load_targets(path: str | Path, *, cluster: str | None = None) -> TargetSet:
    """Read and validate a targets file; ``cluster`` overrides the file's ``cluster`` key.

    Raises ConfigError naming the file, the entry and the key that is wrong.
    """
    p = Path(path)
    return parse_targets(read_yaml(p, "targets file"), source=str(p), cluster=cluster)


def read_yaml(path: Path, what: str) -> object:
    """The YAML document of an operator's file, or a ConfigError naming the file (and the
    line of a syntax error): ``what`` says which file it is ("targets file", …)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {what} is not UTF-8: {exc.reason}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{where}: invalid YAML: {problem}") from exc


def parse_targets(
    doc: object, *, source: str = "<targets>", cluster: str | None = None
) -> TargetSet:
    """Validate an already-loaded targets document (see :func:`load_targets`)."""
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: expected a mapping with keys 'cluster' and 'targets'")
    _no_unknown_keys(doc, _TOP_KEYS, source)
    name = cluster if cluster is not None else doc.get("cluster", "default")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{source}: 'cluster' must be a non-empty string")
    entries = doc.get("targets")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{source}: 'targets' must be a non-empty list")
    targets: list[Target] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: targets[{i}]"
        target = _parse_target(entry, where)
        if target.name in seen:
            raise ConfigError(
                f"{where}: duplicate name {target.name!r} (also targets[{seen[target.name]}])"
            )
        seen[target.name] = i
        targets.append(target)
    return TargetSet(cluster=name.strip(), targets=tuple(targets))


def _parse_target(entry: object, where: str) -> Target:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected a mapping with keys name, url, kind")
    name = _required_str(entry, "name", where)
    where = f"{where} ({name})"
    _no_unknown_keys(entry, _TARGET_KEYS, where)
    url = _required_str(entry, "url", where)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: 'url' must be an http(s) URL with a host, got {url!r}")
    kind = entry.get("kind", "vllm")
    if kind not in TARGET_KINDS:
        raise ConfigError(f"{where}: 'kind' must be one of {', '.join(TARGET_KINDS)}, got {kind!r}")
    engine = _parse_engine(entry["engine"], f"{where}.engine") if "engine" in entry else None
    return Target(name=name, url=url, kind=cast(TargetKind, kind), engine=engine)


def _parse_engine(raw: object, where: str) -> EngineMeta:
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{where}: expected a mapping with keys {', '.join(sorted(_ENGINE_KEYS))}"
        )
    _no_unknown_keys(raw, _ENGINE_KEYS, where)
    model = _optional_str(raw, "model", where)
    gpu = _optional_str(raw, "gpu", where)
    tp = raw.get("tensor_parallel")
    if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int) or tp < 1):
        raise ConfigError(f"{where}: 'tensor_parallel' must be an integer >= 1, got {tp!r}")
    offload = raw.get("offload")
    if offload is not None and offload not in OFFLOAD_MODES:
        raise ConfigError(
            f"{where}: 'offload' must be one of {', '.join(OFFLOAD_MODES)}, got {offload!r}"
        )
    mode = cast(OffloadMode, offload) if offload is not None else None
    pool = _optional_str(raw, "pool", where)
    return EngineMeta(model=model, gpu=gpu, tensor_parallel=tp, offload=mode, pool=pool)


def _no_unknown_keys(doc: Mapping[object, object], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


def _required_str(doc: Mapping[object, object], key: str, where: str) -> str:
    if key not in doc:
        raise ConfigError(f"{where}: missing required key {key!r}")
    value = _optional_str(doc, key, where)
    if value is None:
        raise ConfigError(f"{where}: {key!r} must be a non-empty string")
    return value


def _optional_str(doc: Mapping[object, object], key: str, where: str) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value.strip()


# --------------------------------------------------------------------------- scraping


class ClientPool:
    """One keep-alive connection per target (collector.http1), all sharing one TLS context,
    as Prometheus keeps one connection per target."""

    def __init__(self) -> None:
        self._tls: ssl.SSLContext | None = None
        self._conns: dict[tuple[str, str], Connection] = {}

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:  # ~0.1 s: build it once, on the first https target
            self._tls = httpx.create_ssl_context()  # httpx's trust store (certifi)
        return self._tls

    def client(self, target: Target) -> Connection:
        """The target's connection; an https target's TLS context is made here, before its
        first request starts, so that building it is not counted against a timeout."""
        key = (target.name, target.url)
        found = self._conns.get(key)
        if found is None:
            if urlsplit(target.url).scheme.lower() == "https":
                self._context()
            found = self._conns[key] = Connection(self._context, user_agent=USER_AGENT)
        return found

    def __len__(self) -> int:
        return len(self._conns)

    async def retain(self, targets: Iterable[Target]) -> None:
        """Close the connections of every target not in ``targets`` (gone or a new URL)."""
        keep = {(t.name, t.url) for t in targets}
        gone = [self._conns.pop(k) for k in list(self._conns) if k not in keep]
        await asyncio.gather(*(c.aclose() for c in gone))

    async def aclose(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        await asyncio.gather(*(c.aclose() for c in conns))

    async def __aenter__(self) -> ClientPool:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


async def scrape_all(
    targets: Sequence[Target] | TargetSet,
    *,
    timeout_s: float,
    concurrency: int,
    max_body_bytes: int,
    client: ClientPool | None = None,
    clock: Clock = time.time,
) -> list[ScrapeResult]:
    """Scrape every target concurrently (at most ``concurrency`` at a time).

    Each target gets ``timeout_s`` from the moment its request starts (waiting for a slot
    does not count) and at most ``max_body_bytes`` of body, enforced while streaming.
    ``client`` is a ClientPool kept across rounds (the collect loop's) or None (a pool for
    this round only). Results come back in the order of ``targets``; none of them raises.
    ``clock`` stamps the snapshots and outcomes (a simulated cluster passes its simulated
    epoch time); timeouts and durations stay in wall seconds.
    """
    if concurrency < 1:
        raise ConfigError(f"scrape concurrency must be >= 1, got {concurrency}")
    if timeout_s <= 0:
        raise ConfigError(f"scrape timeout must be > 0, got {timeout_s}")
    pool = ClientPool() if client is None else client
    slots = asyncio.Semaphore(concurrency)

    async def one(target: Target, conn: Connection) -> ScrapeResult:
        async with slots:
            return await scrape_one(
                conn, target, timeout_s=timeout_s, max_body_bytes=max_body_bytes, clock=clock
            )

    conns = [pool.client(t) for t in targets]  # every one made before the first request
    try:
        return list(await asyncio.gather(*(one(t, c) for t, c in zip(targets, conns, strict=True))))
    finally:
        if client is None:
            await pool.aclose()


class FetchFailed(Exception):
    """A fetch that got no usable body: ``kind`` and ``message`` as a scrape outcome names
    them (connect, refused, redirect, http_status, too_large, truncated, parse)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass
class Progress:
    """How much of a body a fetch has read so far (for the outcome of a failed one)."""

    size: int = 0


async def fetch_body(  # noqa: PLR0912, PLR0915 - each way a scrape fails, named as Prometheus does
    conn: Connection, target: Target, *, max_body_bytes: int, progress: Progress | None = None
) -> bytes:
    """The target's /metrics body, inflated, at most ``max_body_bytes`` (enforced while
    streaming, inflated bytes counted); redirects followed on the target's own origin only;
    a guarded target's URL checked and its connection pinned to the checked address.
    Raises FetchFailed; the caller bounds the time (asyncio.timeout)."""
    at = progress if progress is not None else Progress()
    chunks: list[bytes] = []
    url = target.url
    try:
        checked: CheckedURL | None = None
        if target.guard is not None:  # a name resolved once, in a thread (getaddrinfo blocks)
            checked = target.guard.check_without_lookup(target.url)
            if checked is None:
                checked = await asyncio.to_thread(target.guard.check, target.url)
        for _hop in range(MAX_REDIRECTS + 1):
            pinned = None if checked is None else pinned_address(checked, url)
            resp = await conn.get(url, REQUEST_HEADERS, connect_to=pinned)
            try:
                if resp.status in REDIRECTS and "location" in resp.headers:
                    following = urljoin(url, resp.headers["location"])
                    if not same_origin(following, target.url):
                        raise FetchFailed(
                            "redirect",
                            f"HTTP {resp.status} to {following} refused: "
                            "redirects are followed only on the target's own origin",
                        )
                    await conn.discard(resp)
                    url = following
                    continue
                if resp.status != 200:
                    raise FetchFailed("http_status", f"HTTP {resp.status} {resp.reason}".rstrip())
                if resp.framing == "length" and resp.length > max_body_bytes:
                    raise FetchFailed(
                        "too_large",
                        f"Content-Length {resp.length} exceeds the {max_body_bytes}-byte cap",
                    )
                encoding = resp.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("", "identity", *_WBITS):
                    raise FetchFailed("parse", f"unsupported Content-Encoding {encoding!r}")
                inflate = zlib.decompressobj(_WBITS[encoding]) if encoding in _WBITS else None
                async for raw in conn.body(resp):
                    data = raw
                    while data:
                        if inflate is None:
                            chunk, data = data, b""
                        else:  # at most one byte past the cap per step
                            chunk = inflate.decompress(data, max_body_bytes - at.size + 1)
                            data = inflate.unconsumed_tail
                        at.size += len(chunk)
                        if at.size > max_body_bytes:
                            what = "inflated body" if inflate is not None else "body"
                            raise FetchFailed(
                                "too_large",
                                f"{what} exceeds the {max_body_bytes}-byte cap (aborted)",
                            )
                        chunks.append(chunk)
                if inflate is not None and not inflate.eof:
                    raise FetchFailed(
                        "truncated", f"{encoding} stream ends early ({at.size} bytes)"
                    )
                return b"".join(chunks)
            finally:
                conn.release()
        raise FetchFailed("http_status", f"more than {MAX_REDIRECTS} redirects")
    except URLRefused as exc:
        raise FetchFailed("refused", str(exc)) from exc
    except ConfigError as exc:  # the guard could not resolve the name
        raise FetchFailed("connect", str(exc)) from exc
    except zlib.error as exc:  # a broken gzip/deflate body
        raise FetchFailed("parse", f"cannot inflate the body: {exc}") from exc
    except BodyCutShort as exc:
        # The server closed (or reset) the connection before the Content-Length or the
        # last chunk: a partial exposition is never read (Prometheus: "unexpected EOF").
        raise FetchFailed("truncated", f"body cut short after {at.size} bytes: {exc}") from exc
    except (ConnectFailed, ProtocolError, ValueError) as exc:
        raise FetchFailed("connect", f"{type(exc).__name__}: {exc}") from exc


async def scrape_one(
    conn: Connection,
    target: Target,
    *,
    timeout_s: float,
    max_body_bytes: int,
    clock: Clock = time.time,
) -> ScrapeResult:
    """Scrape one target; every failure becomes an outcome with an ``error_kind``."""
    started = clock()
    t0 = time.perf_counter()
    at = Progress()

    def failed(kind: str, message: str) -> ScrapeResult:
        log.info("scrape %s (%s) failed: %s: %s", target.name, target.url, kind, message)
        outcome = ScrapeOutcome(
            target=target.name,
            started=started,
            duration_s=time.perf_counter() - t0,
            up=False,
            bytes=at.size,
            error_kind=kind,
            error=message,
        )
        return ScrapeResult(target=target, outcome=outcome)

    try:
        async with asyncio.timeout(timeout_s):
            body = await fetch_body(conn, target, max_body_bytes=max_body_bytes, progress=at)
    except FetchFailed as exc:
        return failed(exc.kind, exc.message)
    except TimeoutError:
        return failed("timeout", f"no complete answer within {timeout_s:g} s")
    size = at.size
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return failed("parse", f"body is not UTF-8 (byte {exc.start})")
    try:
        # A large exposition is parsed in a worker thread: it must not stall the event loop
        # (and eat into the timeouts of the scrapes still in flight). A usual one (vLLM's is
        # 48-135 KB: 1.5-4.5 ms) is parsed here: the hand-off to a thread and back, and the
        # GIL passed between them, cost 0.4 ms a scrape (benchmarks/bench_scrape.py).
        if size <= INLINE_PARSE_BYTES:
            snapshot = read_exposition(text, target.name, started)
        else:
            snapshot = await asyncio.to_thread(read_exposition, text, target.name, started)
    except ParseError as exc:
        return failed("parse", f"line {exc.line}: {exc.reason}")
    except Exception as exc:  # a parser bug on odd input must not stop the other targets
        log.exception("parser crashed on %s", target.name)
        return failed("parse", f"parser crashed: {type(exc).__name__}: {exc}")
    outcome = ScrapeOutcome(
        target=target.name,
        started=started,
        duration_s=time.perf_counter() - t0,
        up=True,
        bytes=size,
        series=len(snapshot.samples),
    )
    return ScrapeResult(target=target, outcome=outcome, snapshot=snapshot)
