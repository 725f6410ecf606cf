"""`kvscope collect`: scrape targets (or read a Prometheus) into the store until stopped."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from collector.gcpolicy import tune_heap
from core.durations import parse_duration
from core.errors import ConfigError
from core.kvscope_metrics import kvscope_version
from kvscope.commands.options import DbOpt, KeepOpt

if TYPE_CHECKING:
    from collections.abc import Iterator
    from contextlib import AbstractContextManager

    from collector.checkpoint import Checkpoints
    from collector.keep import Keep
    from collector.run import CollectStats, LoopParts
    from collector.run_config import CollectConfig, DirectConfig, PrometheusConfig
    from collector.self_metrics import CollectorHealth
    from collector.shard import Shard
    from collector.spool import Spool
    from kvscope.cli_settings import Settings
    from store.store import Store

PROGRESS_EVERY_S = 10.0
# /healthz fails after this many intervals without a scrape or tick, and never sooner than
# STALE_MIN_S: a slow Prometheus query or a long tick is not a hung loop
STALE_TICKS = 10
STALE_MIN_S = 300.0
_FLAGS = {
    "db": "--db",
    "cluster": "--cluster",
    "window_s": "--window",
    "scrape_interval_s": "--interval",
    "scrape_timeout_s": "--timeout",
    "allowed_target_networks": "--allow-network",
    "state_dir": "--state-dir",
    "retention_s": "--retention",
    "downsample_s": "--downsample-after",
    "checkpoint_s": "--checkpoint-every",
}


class _Progress:
    """One line on stderr at most every PROGRESS_EVERY_S seconds (and at the end)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.last = time.monotonic()

    def __call__(self, stats: object) -> None:
        now = time.monotonic()
        if self.quiet or now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        print(stats.progress_line(), file=sys.stderr, flush=True)  # type: ignore[attr-defined]


def retention_seconds(text: str, what: str) -> float:
    """A retention period from a duration (``30d``), refused below
    kvscope.cli_settings.MIN_RETENTION_S: a bare ``30`` is 30 seconds, which would delete
    nearly everything."""
    from kvscope.cli_settings import MIN_RETENTION_S

    seconds = parse_duration(text, what)
    if seconds < MIN_RETENTION_S:
        raise ConfigError(
            f"{what} must be at least 1h, got {text!r} ({seconds:g} s): a shorter one would "
            "delete the windows plans are made of"
        )
    return seconds


TargetsOpt = Annotated[
    Path | None, typer.Option("--targets", help="targets YAML (see examples/targets.yaml)")
]
PrometheusOpt = Annotated[
    str | None,
    typer.Option("--prometheus", help="read windows from this Prometheus/Thanos/Mimir URL"),
]
IntervalOpt = Annotated[
    str | None, typer.Option("--interval", help="scrape / poll interval, e.g. 15s")
]
WindowOpt = Annotated[str | None, typer.Option("--window", help="rollup window, e.g. 60s")]
OnceOpt = Annotated[bool, typer.Option("--once", help="one scrape (or one back-fill), then exit")]
ClusterNameOpt = Annotated[
    str | None, typer.Option("--cluster", help="cluster name (overrides the file's)")
]
BackfillOpt = Annotated[
    str, typer.Option("--since", help="Prometheus mode: back-fill this far back")
]
TimeoutOpt = Annotated[
    str | None, typer.Option("--timeout", help="per-target scrape timeout, e.g. 10s")
]
SourceLabelOpt = Annotated[
    str,
    typer.Option("--source-label", help="Prometheus mode: instance or job/instance"),
]
SettleOpt = Annotated[
    str,
    typer.Option("--settle", help="Prometheus mode: leave out windows younger than this"),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress lines")]
MetricsAddrOpt = Annotated[
    str | None,
    typer.Option(
        "--metrics-addr",
        help="serve the collector's own /metrics on HOST:PORT, e.g. 127.0.0.1:9464",
    ),
]
TargetsFromStoreOpt = Annotated[
    bool,
    typer.Option(
        "--targets-from-store",
        help="also scrape the store's targets table (POST /v1/targets), re-read each tick",
    ),
]
AllowNetworkOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-network",
        metavar="CIDR",
        help="store targets may point into this private/loopback network (repeatable)",
    ),
]
EnginesOpt = Annotated[
    Path | None,
    typer.Option(
        "--engines",
        help="engines.yaml: GPU, TP, DRAM by label matcher (examples/engines.yaml)",
    ),
]
FileSdOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--file-sd",
        metavar="PATH_OR_GLOB",
        help="also scrape Prometheus file_sd JSON/YAML target files, re-read on change "
        "(repeatable)",
    ),
]
RetentionOpt = Annotated[
    str | None,
    typer.Option(
        "--retention",
        help="delete windows and outcomes older than this every hour, e.g. 30d (>= 1h; "
        "KVSCOPE_RETENTION_S)",
    ),
]
DownsampleOpt = Annotated[
    str | None,
    typer.Option(
        "--downsample-after",
        help="every hour, turn the 1-minute windows of days older than this into "
        "5-minute ones, e.g. 7d (the default; 'never' keeps minutes; "
        "KVSCOPE_DOWNSAMPLE_S)",
    ),
]
ShardOpt = Annotated[
    str | None,
    typer.Option(
        "--shard",
        metavar="I/N",
        envvar="KVSCOPE_SHARD",
        help="direct mode: scrape only the targets whose name hashes to shard I of N "
        "(Prometheus' hashmod)",
    ),
]
CheckpointOpt = Annotated[
    str | None,
    typer.Option(
        "--checkpoint-every",
        metavar="DURATION",
        help="direct mode: at most this long between roll-up checkpoints, besides the "
        "one after each tick that closes windows (default 60s; 0: after every tick)",
    ),
]
StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="direct mode's local state: windows the store refused, roll-up checkpoints "
        "(default: DBFILE-state beside a SQLite file, else under $XDG_STATE_HOME/kvscope)",
    ),
]


@dataclass(frozen=True, slots=True)
class CollectFlags:
    """The flags of `kvscope collect` as given (unchecked: collect_config checks them)."""

    targets: Path | None = None
    prometheus: str | None = None
    db: str | None = None
    interval: str | None = None
    window: str | None = None
    once: bool = False
    cluster: str | None = None
    since: str = "1h"
    timeout: str | None = None
    source_label: str = "instance"
    settle: str = "30s"
    quiet: bool = False
    metrics_addr: str | None = None
    targets_from_store: bool = False
    allow_network: tuple[str, ...] = ()
    engines: Path | None = None
    file_sd: tuple[str, ...] = ()
    retention: str | None = None
    downsample_after: str | None = None
    shard: str | None = None
    checkpoint_every: str | None = None
    state_dir: Path | None = None
    keep: str = "used"


def collect_cmd(  # noqa: PLR0917 - one parameter per CLI flag
    targets: TargetsOpt = None,
    prometheus: PrometheusOpt = None,
    db: DbOpt = None,
    interval: IntervalOpt = None,
    window: WindowOpt = None,
    once: OnceOpt = False,
    cluster: ClusterNameOpt = None,
    since: BackfillOpt = "1h",
    timeout: TimeoutOpt = None,
    source_label: SourceLabelOpt = "instance",
    settle: SettleOpt = "30s",
    quiet: QuietOpt = False,
    metrics_addr: MetricsAddrOpt = None,
    targets_from_store: TargetsFromStoreOpt = False,
    allow_network: AllowNetworkOpt = None,
    engines: EnginesOpt = None,
    file_sd: FileSdOpt = None,
    retention: RetentionOpt = None,
    downsample_after: DownsampleOpt = None,
    shard: ShardOpt = None,
    checkpoint_every: CheckpointOpt = None,
    state_dir: StateDirOpt = None,
    keep: KeepOpt = "used",
) -> None:
    """Collect windows into the store until Ctrl-C / SIGTERM (then flush, exit 0).

    Direct mode scrapes --targets, --targets-from-store and --file-sd targets each --interval
    (on a name clash the --targets file wins over file_sd, file_sd over the store); Prometheus
    mode (--prometheus URL) back-fills --since, then polls. Outages and restarts (--state-dir)
    lose no counter increase. JSON summary on stdout; details in the README's Quickstart.

    Example: kvscope collect --targets examples/targets.yaml --db sqlite:///kvscope.db
    Example: kvscope collect --prometheus http://prometheus:9090 --engines engines.yaml
    Example: kvscope collect --file-sd 'sd/*.json' --db sqlite:///kvscope.db"""
    flags = CollectFlags(
        targets=targets, prometheus=prometheus, db=db, interval=interval, window=window,
        once=once, cluster=cluster, since=since, timeout=timeout, source_label=source_label,
        settle=settle, quiet=quiet, metrics_addr=metrics_addr,
        targets_from_store=targets_from_store, allow_network=tuple(allow_network or ()),
        engines=engines, file_sd=tuple(file_sd or ()), retention=retention,
        downsample_after=downsample_after, shard=shard, checkpoint_every=checkpoint_every,
        state_dir=state_dir, keep=keep,
    )  # fmt: skip
    try:
        summary = run_collect(collect_config(flags))
    except KeyboardInterrupt:  # Ctrl-C before the loop installed its handler
        print("kvscope: interrupted before collecting", file=sys.stderr)
        raise typer.Exit(130) from None
    typer.echo(json.dumps(summary))


def register(app: typer.Typer) -> None:
    app.command("collect")(collect_cmd)


# --------------------------------------------------------------------------- the flags


def collect_config(flags: CollectFlags) -> CollectConfig:
    """The run's config from the flags and the settings, checked once: a ConfigError names
    the flag (or the KVSCOPE_ variable) that was wrong."""
    from collector.keep import parse_keep
    from collector.run_config import CollectConfig
    from collector.shard import Shard

    _check_modes(flags)
    keep = parse_keep(flags.keep)
    shard = Shard.parse(flags.shard) if flags.shard is not None else None
    _check_sources(flags)
    settings = _settings(flags)
    return CollectConfig(
        db=settings.db,
        loop=_loop_config(flags, settings, keep, shard),
        default_cluster=settings.cluster,
        cluster=flags.cluster,
        targets=flags.targets,
        targets_from_store=flags.targets_from_store,
        allowed_networks=settings.allowed_target_networks,
        file_sd=flags.file_sd,
        prometheus=flags.prometheus,
        source_from="job/instance" if flags.source_label == "job/instance" else "instance",
        query_timeout_s=settings.scrape_timeout_s,
        engines=flags.engines,
        metrics_addr=flags.metrics_addr,
        state_dir=settings.state_dir,
        spool_max_bytes=settings.spool_max_bytes,
        spool_memory_windows=settings.spool_memory_windows,
        retention_s=settings.retention_s,
        downsample_s=settings.downsample_s,
        keep_name=flags.keep,
        quiet=flags.quiet,
    )


def _check_modes(flags: CollectFlags) -> None:
    """The direct-mode flags are refused with --prometheus."""
    prometheus = flags.prometheus is not None
    if flags.targets_from_store and prometheus:
        raise ConfigError("--targets-from-store is direct mode: not with --prometheus")
    if flags.allow_network and not flags.targets_from_store:
        raise ConfigError("--allow-network applies to --targets-from-store targets only")
    if flags.file_sd and prometheus:
        raise ConfigError("--file-sd is direct mode: not with --prometheus")
    if flags.checkpoint_every is not None and prometheus:
        raise ConfigError("--checkpoint-every is direct mode: not with --prometheus")
    if flags.shard is not None and prometheus:
        raise ConfigError(
            "--shard splits scrape targets (direct mode): a Prometheus is read whole, "
            "one collector per Prometheus or cluster"
        )


def _check_sources(flags: CollectFlags) -> None:
    """Exactly one mode; the file_sd patterns, --source-label and --metrics-addr well-formed."""
    from collector.file_sd import check_pattern
    from collector.self_metrics import parse_listen_addr

    direct = flags.targets is not None or flags.targets_from_store or bool(flags.file_sd)
    if direct == (flags.prometheus is not None):
        raise ConfigError(
            "give exactly one of --targets FILE or --prometheus URL "
            "(or --targets-from-store, --file-sd)"
        )
    for pattern in flags.file_sd:
        try:
            check_pattern(pattern)
        except ConfigError as exc:
            raise ConfigError(f"--file-sd {exc}") from exc
    if flags.source_label not in ("instance", "job/instance"):
        raise ConfigError(
            f"--source-label must be instance or job/instance, got {flags.source_label!r}"
        )
    if flags.metrics_addr is not None:
        parse_listen_addr(flags.metrics_addr, "--metrics-addr")


def _settings(flags: CollectFlags) -> Settings:
    """The settings (KVSCOPE_ variables) with the flags over them; a bad value names its flag."""
    from pydantic import ValidationError

    from kvscope.cli_settings import get_settings

    def seconds(text: str | None, flag: str, *, allow_zero: bool = False) -> float | None:
        return None if text is None else parse_duration(text, flag, allow_zero=allow_zero)

    try:
        return get_settings(
            db=flags.db,
            cluster=flags.cluster,
            scrape_interval_s=seconds(flags.interval, "--interval"),
            window_s=seconds(flags.window, "--window"),
            scrape_timeout_s=seconds(flags.timeout, "--timeout"),
            allowed_target_networks=flags.allow_network or None,
            state_dir=flags.state_dir,
            retention_s=None
            if flags.retention is None
            else retention_seconds(flags.retention, "--retention"),
            **_downsample(flags.downsample_after),
            checkpoint_s=seconds(flags.checkpoint_every, "--checkpoint-every", allow_zero=True),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(map(str, first["loc"]))
        flag = _FLAGS.get(field, field)
        raise ConfigError(f"{flag} (or KVSCOPE_{field.upper()}): {first['msg']}") from exc


def _loop_config(
    flags: CollectFlags, settings: Settings, keep: Keep, shard: Shard | None
) -> DirectConfig | PrometheusConfig:
    """The direct loop's config, or (with --prometheus) the Prometheus loop's."""
    from collector.run_config import DirectConfig, PrometheusConfig

    if flags.prometheus is None:
        return DirectConfig(
            interval_s=settings.scrape_interval_s,
            window_s=settings.window_s,
            timeout_s=settings.scrape_timeout_s,
            concurrency=settings.scrape_concurrency,
            max_body_bytes=settings.max_body_bytes,
            once=flags.once,
            checkpoint_s=settings.checkpoint_s,
            shard=shard,
            keep=keep,
        )
    return PrometheusConfig(
        cluster=settings.cluster,
        window_s=settings.window_s,
        since_s=parse_duration(flags.since, "--since"),
        interval_s=settings.scrape_interval_s,
        settle_s=parse_duration(flags.settle, "--settle", allow_zero=True),
        once=flags.once,
        keep=keep,
    )


# --------------------------------------------------------------------------- the run


def run_collect(config: CollectConfig) -> dict[str, object]:
    """Run the loop ``config`` describes until stopped; the JSON summary."""
    from collector import run
    from collector.engine_rules import load_engine_rules
    from collector.run_config import DirectConfig
    from store.retention import Pruner
    from store.store import Store

    logging.basicConfig(
        level=logging.ERROR if config.quiet else logging.WARNING,
        format="kvscope: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # its retries end in one ScrapeError
    progress = _Progress(config.quiet)
    rules = load_engine_rules(config.engines) if config.engines is not None else None
    state: Path | None = None
    with Store(config.db) as store:
        store.migrate()
        pruner = (
            Pruner(store, config.retention_s, downsample_s=config.downsample_s)
            if config.retention_s or config.downsample_s
            else None
        )
        parts = run.LoopParts(progress=progress, engine_rules=rules, pruner=pruner)
        if isinstance(config.loop, DirectConfig):
            stats, cluster_name, state = _run_direct(config, config.loop, store, parts)
        else:
            stats, cluster_name = _run_prometheus(config, config.loop, store, parts)
    if not config.quiet:
        print(stats.progress_line(), file=sys.stderr, flush=True)
    out: dict[str, object] = {**stats.summary(), "cluster": cluster_name, "db": store.url,
                              "keep": config.keep_name}  # fmt: skip
    if pruner is not None:
        out["retention"] = pruner.summary()
    return out | ({"state_dir": str(state)} if state is not None else {})


def _run_direct(
    config: CollectConfig, loop: DirectConfig, store: Store, parts: LoopParts
) -> tuple[CollectStats, str, Path | None]:
    """Direct mode: the targets' sources, the health server, the local state, then the loop;
    (its statistics, the cluster, the state directory)."""
    from collector import run
    from collector.file_sd import FileSD
    from collector.scrape import TargetSet, load_targets
    from collector.urlguard import URLPolicy

    target_set = (
        load_targets(config.targets, cluster=config.cluster)
        if config.targets is not None
        else TargetSet(cluster=config.default_cluster, targets=())
    )
    store_targets = (
        run.StoreTargets(URLPolicy(config.allowed_networks), cluster=config.cluster)
        if config.targets_from_store
        else None
    )
    discovery = FileSD(config.file_sd, cluster=target_set.cluster) if config.file_sd else None
    own = loop.shard.select(target_set) if loop.shard is not None else list(target_set)
    health = _health(
        config.metrics_addr, target_set.cluster, "direct", [t.name for t in own],
        shard=str(loop.shard or "0/1"), interval_s=loop.interval_s,
    )  # fmt: skip
    state = _state_dir(config.state_dir, config.db)
    spool, checkpoints = _local_state(state, store.url, config)
    direct = run.DirectParts(
        progress=parts.progress, health=health, engine_rules=parts.engine_rules,
        pruner=parts.pruner, store_targets=store_targets, file_sd=discovery, spool=spool,
        checkpoints=checkpoints,
    )  # fmt: skip
    with _serving(config.metrics_addr, health, config.quiet), _closing(checkpoints):
        tune_heap()  # collector.gcpolicy: after start-up, before the loop
        stats = run.run_until_signalled(
            lambda stop: run.collect_direct(target_set, store, loop, direct, stop=stop)
        )
    return stats, target_set.cluster, state


def _run_prometheus(
    config: CollectConfig, loop: PrometheusConfig, store: Store, parts: LoopParts
) -> tuple[CollectStats, str]:
    """Prometheus mode: the source, the health server, then the loop; (its statistics, the
    cluster)."""
    from collector import run, run_prometheus
    from collector.promsource import PrometheusSource

    assert config.prometheus is not None
    with PrometheusSource(
        config.prometheus, timeout_s=config.query_timeout_s, source_from=config.source_from
    ) as source:
        health = _health(config.metrics_addr, loop.cluster, "prometheus", [source.url],
                         interval_s=loop.interval_s)  # fmt: skip
        with_health = replace(parts, health=health)
        with _serving(config.metrics_addr, health, config.quiet):
            tune_heap()
            stats = run.run_until_signalled(
                lambda stop: run_prometheus.collect_prometheus(
                    source, store, loop, with_health, stop=stop
                )
            )
    return stats, loop.cluster


def _state_dir(configured: Path | None, db: str) -> Path | None:
    """--state-dir (KVSCOPE_STATE_DIR), else the store's default (None: an in-memory store)."""
    from collector.checkpoint import state_dir_for

    return configured if configured is not None else state_dir_for(db, os.environ)


def _local_state(
    state: Path | None, store_id: str, config: CollectConfig
) -> tuple[Spool, Checkpoints | None]:
    """The spool (``STATE/spool``) and the roll-up checkpoints (``STATE/rollup``)."""
    from collector.checkpoint import Checkpoints

    spool = _spool(state, store_id, config)
    if state is None:
        return spool, None
    try:
        return spool, Checkpoints(state / "rollup", store_id=store_id)
    except OSError as exc:
        raise ConfigError(f"--state-dir {state}: {exc.strerror or exc}") from exc


def _spool(state: Path | None, store_id: str, config: CollectConfig) -> Spool:
    """Where windows the store refuses wait: ``STATE/spool`` (None: in memory only)."""
    from collector.spool import Spool

    return Spool(
        None if state is None else state / "spool",
        store_id=store_id,
        max_bytes=config.spool_max_bytes,
        memory_records=config.spool_memory_windows,
    )


@contextlib.contextmanager
def _closing(checkpoints: Checkpoints | None) -> Iterator[None]:
    """Let go of the checkpoint locks at the end (the files stay: a restart resumes them)."""
    try:
        yield
    finally:
        if checkpoints is not None:
            checkpoints.close()


def _health(
    addr: str | None,
    cluster: str,
    mode: str,
    targets: Sequence[str],
    shard: str = "0/1",
    *,
    interval_s: float,
) -> CollectorHealth | None:
    """The collector's own metrics when --metrics-addr is given (None: nothing kept); its
    /healthz fails after STALE_TICKS intervals without a scrape or tick (at least
    STALE_MIN_S)."""
    if addr is None:
        return None
    from collector.self_metrics import CollectorHealth

    return CollectorHealth(
        version=kvscope_version(), cluster=cluster, mode=mode, targets=targets, shard=shard,
        stale_after_s=max(STALE_TICKS * interval_s, STALE_MIN_S),
    )  # fmt: skip


def _serving(
    addr: str | None, health: CollectorHealth | None, quiet: bool
) -> AbstractContextManager[object]:
    """Serve ``health`` on ``addr`` for the duration of the loop (no-op without it)."""
    if addr is None or health is None:
        return contextlib.nullcontext()
    from collector.self_metrics import serve_metrics

    server = serve_metrics(addr, health.registry, what="--metrics-addr", check=health.alive)
    if not quiet:
        print(f"kvscope: collector metrics on {server.url}", file=sys.stderr, flush=True)
    return server


def _downsample(flag: str | None) -> dict[str, float | str]:
    """The settings override of --downsample-after (none given: the settings' own; never
    goes as it is, Settings reads it)."""
    if flag is None:
        return {}
    if flag.strip() == "never":
        return {"downsample_s": flag}
    return {"downsample_s": retention_seconds(flag, "--downsample-after")}
