"""`kvscope collect`: scrape targets (or read a Prometheus) into the store until stopped."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from core.durations import parse_duration
from core.errors import ConfigError
from core.kvscope_metrics import kvscope_version
from kvscope.commands.options import DbOpt, KeepOpt

if TYPE_CHECKING:
    from collections.abc import Iterator
    from contextlib import AbstractContextManager

    from collector.checkpoint import Checkpoints
    from collector.health import CollectorHealth
    from collector.spool import Spool
    from kvscope.config import Settings

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
    kvscope.config.MIN_RETENTION_S: a bare ``30`` is 30 seconds, which would delete
    nearly everything."""
    from kvscope.config import MIN_RETENTION_S

    seconds = parse_duration(text, what)
    if seconds < MIN_RETENTION_S:
        raise ConfigError(
            f"{what} must be at least 1h, got {text!r} ({seconds:g} s): a shorter one would "
            "delete the windows plans are made of"
        )
    return seconds


def register(app: typer.Typer) -> None:
    @app.command("collect")
    def collect_cmd(  # noqa: PLR0917 - one parameter per CLI flag
        targets: Annotated[
            Path | None, typer.Option("--targets", help="targets YAML (see examples/targets.yaml)")
        ] = None,
        prometheus: Annotated[
            str | None,
            typer.Option("--prometheus", help="read windows from this Prometheus/Thanos/Mimir URL"),
        ] = None,
        db: DbOpt = None,
        interval: Annotated[
            str | None, typer.Option("--interval", help="scrape / poll interval, e.g. 15s")
        ] = None,
        window: Annotated[
            str | None, typer.Option("--window", help="rollup window, e.g. 60s")
        ] = None,
        once: Annotated[
            bool, typer.Option("--once", help="one scrape (or one back-fill), then exit")
        ] = False,
        cluster: Annotated[
            str | None, typer.Option("--cluster", help="cluster name (overrides the file's)")
        ] = None,
        since: Annotated[
            str, typer.Option("--since", help="Prometheus mode: back-fill this far back")
        ] = "1h",
        timeout: Annotated[
            str | None, typer.Option("--timeout", help="per-target scrape timeout, e.g. 10s")
        ] = None,
        source_label: Annotated[
            str,
            typer.Option("--source-label", help="Prometheus mode: instance or job/instance"),
        ] = "instance",
        settle: Annotated[
            str,
            typer.Option("--settle", help="Prometheus mode: leave out windows younger than this"),
        ] = "30s",
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress lines")] = False,
        metrics_addr: Annotated[
            str | None,
            typer.Option(
                "--metrics-addr",
                help="serve the collector's own /metrics on HOST:PORT, e.g. 127.0.0.1:9464",
            ),
        ] = None,
        targets_from_store: Annotated[
            bool,
            typer.Option(
                "--targets-from-store",
                help="also scrape the store's targets table (POST /v1/targets), re-read each tick",
            ),
        ] = False,
        allow_network: Annotated[
            list[str] | None,
            typer.Option(
                "--allow-network",
                metavar="CIDR",
                help="store targets may point into this private/loopback network (repeatable)",
            ),
        ] = None,
        engines: Annotated[
            Path | None,
            typer.Option(
                "--engines",
                help="engines.yaml: GPU, TP, DRAM by label matcher (examples/engines.yaml)",
            ),
        ] = None,
        file_sd: Annotated[
            list[str] | None,
            typer.Option(
                "--file-sd",
                metavar="PATH_OR_GLOB",
                help="also scrape Prometheus file_sd JSON/YAML target files, re-read on change "
                "(repeatable)",
            ),
        ] = None,
        retention: Annotated[
            str | None,
            typer.Option(
                "--retention",
                help="delete windows and outcomes older than this every hour, e.g. 30d (>= 1h; "
                "KVSCOPE_RETENTION_S)",
            ),
        ] = None,
        downsample_after: Annotated[
            str | None,
            typer.Option(
                "--downsample-after",
                help="every hour, turn the 1-minute windows of days older than this into "
                "5-minute ones, e.g. 7d (the default; 'never' keeps minutes; "
                "KVSCOPE_DOWNSAMPLE_S)",
            ),
        ] = None,
        shard: Annotated[
            str | None,
            typer.Option(
                "--shard",
                metavar="I/N",
                envvar="KVSCOPE_SHARD",
                help="direct mode: scrape only the targets whose name hashes to shard I of N "
                "(Prometheus' hashmod)",
            ),
        ] = None,
        checkpoint_every: Annotated[
            str | None,
            typer.Option(
                "--checkpoint-every",
                metavar="DURATION",
                help="direct mode: at most this long between roll-up checkpoints, besides the "
                "one after each tick that closes windows (default 60s; 0: after every tick)",
            ),
        ] = None,
        state_dir: Annotated[
            Path | None,
            typer.Option(
                "--state-dir",
                help="direct mode's local state: windows the store refused, roll-up checkpoints "
                "(default: DBFILE-state beside a SQLite file, else under $XDG_STATE_HOME/kvscope)",
            ),
        ] = None,
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
        try:
            summary = run_collect(
                targets=targets,
                prometheus=prometheus,
                db=db,
                interval=interval,
                window=window,
                once=once,
                cluster=cluster,
                since=since,
                timeout=timeout,
                source_label=source_label,
                settle=settle,
                quiet=quiet,
                metrics_addr=metrics_addr,
                targets_from_store=targets_from_store,
                allow_network=allow_network,
                engines=engines,
                file_sd=file_sd,
                state_dir=state_dir,
                checkpoint_every=checkpoint_every,
                shard=shard,
                retention=retention,
                keep=keep,
                downsample_after=downsample_after,
            )
        except KeyboardInterrupt:  # Ctrl-C before the loop installed its handler
            print("kvscope: interrupted before collecting", file=sys.stderr)
            raise typer.Exit(130) from None
        typer.echo(json.dumps(summary))


def run_collect(
    *,
    targets: Path | None,
    prometheus: str | None,
    db: str | None,
    interval: str | None,
    window: str | None,
    once: bool,
    cluster: str | None,
    since: str,
    timeout: str | None,
    source_label: str,
    settle: str,
    quiet: bool,
    metrics_addr: str | None = None,
    targets_from_store: bool = False,
    allow_network: Sequence[str] | None = None,
    engines: Path | None = None,
    file_sd: Sequence[str] | None = None,
    state_dir: Path | None = None,
    shard: str | None = None,
    retention: str | None = None,
    checkpoint_every: str | None = None,
    keep: str = "used",
    downsample_after: str | None = None,
) -> dict[str, object]:
    """Validate the flags, run the loop, return the JSON summary."""
    from pydantic import ValidationError

    from collector import run, run_prometheus
    from collector.keep import parse_keep
    from kvscope.config import get_settings
    from store.store import Store

    if targets_from_store and prometheus is not None:
        raise ConfigError("--targets-from-store is direct mode: not with --prometheus")
    if allow_network and not targets_from_store:
        raise ConfigError("--allow-network applies to --targets-from-store targets only")
    if file_sd and prometheus is not None:
        raise ConfigError("--file-sd is direct mode: not with --prometheus")
    if checkpoint_every is not None and prometheus is not None:
        raise ConfigError("--checkpoint-every is direct mode: not with --prometheus")
    if shard is not None and prometheus is not None:
        raise ConfigError(
            "--shard splits scrape targets (direct mode): a Prometheus is read whole, "
            "one collector per Prometheus or cluster"
        )
    from collector.shard import Shard

    kept = parse_keep(keep)
    sharding = Shard.parse(shard) if shard is not None else None
    if (targets is None and not targets_from_store and not file_sd) == (prometheus is None):
        raise ConfigError(
            "give exactly one of --targets FILE or --prometheus URL "
            "(or --targets-from-store, --file-sd)"
        )
    for pattern in file_sd or ():
        from collector.file_sd import check_pattern

        try:
            check_pattern(pattern)
        except ConfigError as exc:
            raise ConfigError(f"--file-sd {exc}") from exc
    if source_label not in ("instance", "job/instance"):
        raise ConfigError(f"--source-label must be instance or job/instance, got {source_label!r}")
    if metrics_addr is not None:
        from collector.health import parse_listen_addr

        parse_listen_addr(metrics_addr, "--metrics-addr")
    try:
        settings = get_settings(
            db=db,
            cluster=cluster,
            scrape_interval_s=None if interval is None else parse_duration(interval, "--interval"),
            window_s=None if window is None else parse_duration(window, "--window"),
            scrape_timeout_s=None if timeout is None else parse_duration(timeout, "--timeout"),
            allowed_target_networks=tuple(allow_network) if allow_network else None,
            state_dir=state_dir,
            retention_s=None if retention is None else retention_seconds(retention, "--retention"),
            **_downsample(downsample_after),
            checkpoint_s=None
            if checkpoint_every is None
            else parse_duration(checkpoint_every, "--checkpoint-every", allow_zero=True),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(map(str, first["loc"]))
        flag = _FLAGS.get(field, field)
        raise ConfigError(f"{flag} (or KVSCOPE_{field.upper()}): {first['msg']}") from exc
    logging.basicConfig(
        level=logging.ERROR if quiet else logging.WARNING,
        format="kvscope: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # its retries end in one ScrapeError
    progress = _Progress(quiet)
    from collector.engine_rules import load_engine_rules

    rules = load_engine_rules(engines) if engines is not None else None
    with Store(settings.db) as store:
        store.migrate()
        from collector.gcpolicy import tune_heap
        from store.retention import Pruner

        pruner = (
            Pruner(store, settings.retention_s, downsample_s=settings.downsample_s)
            if settings.retention_s or settings.downsample_s
            else None
        )
        if targets is not None or targets_from_store or file_sd:
            from collector.file_sd import FileSD
            from collector.sources import TargetSet, load_targets
            from collector.urlguard import URLPolicy

            target_set = (
                load_targets(targets, cluster=cluster)
                if targets is not None
                else TargetSet(cluster=settings.cluster, targets=())
            )
            store_targets = (
                run.StoreTargets(URLPolicy(settings.allowed_target_networks), cluster=cluster)
                if targets_from_store
                else None
            )
            discovery = FileSD(file_sd, cluster=target_set.cluster) if file_sd else None
            own = sharding.select(target_set) if sharding is not None else list(target_set)
            health = _health(
                metrics_addr, target_set.cluster, "direct", [t.name for t in own],
                shard=str(sharding or "0/1"), interval_s=settings.scrape_interval_s,
            )  # fmt: skip
            state = _state_dir(settings.state_dir, settings.db)
            spool, checkpoints = _local_state(state, store.url, settings)
            with _serving(metrics_addr, health, quiet), _closing(checkpoints):
                tune_heap()  # collector.gcpolicy: after start-up, before the loop
                stats = run.run_until_signalled(
                    lambda stop: run.collect_direct(
                        target_set,
                        store,
                        interval_s=settings.scrape_interval_s,
                        window_s=settings.window_s,
                        timeout_s=settings.scrape_timeout_s,
                        concurrency=settings.scrape_concurrency,
                        max_body_bytes=settings.max_body_bytes,
                        once=once,
                        stop=stop,
                        progress=progress,
                        health=health,
                        store_targets=store_targets,
                        engine_rules=rules,
                        file_sd=discovery,
                        spool=spool,
                        checkpoints=checkpoints,
                        checkpoint_s=settings.checkpoint_s,
                        shard=sharding,
                        pruner=pruner,
                        keep=kept,
                    )
                )
            cluster_name = target_set.cluster
        else:
            assert prometheus is not None
            state = None
            from collector.promsource import PrometheusSource

            since_s = parse_duration(since, "--since")
            settle_s = parse_duration(settle, "--settle", allow_zero=True)
            with PrometheusSource(
                prometheus,
                timeout_s=settings.scrape_timeout_s,
                source_from="job/instance" if source_label == "job/instance" else "instance",
            ) as source:
                health = _health(metrics_addr, settings.cluster, "prometheus", [source.url],
                                 interval_s=settings.scrape_interval_s)  # fmt: skip
                with _serving(metrics_addr, health, quiet):
                    tune_heap()
                    stats = run.run_until_signalled(
                        lambda stop: run_prometheus.collect_prometheus(
                            source,
                            store,
                            cluster=settings.cluster,
                            window_s=settings.window_s,
                            since_s=since_s,
                            interval_s=settings.scrape_interval_s,
                            settle_s=settle_s,
                            once=once,
                            stop=stop,
                            progress=progress,
                            health=health,
                            engine_rules=rules,
                            pruner=pruner,
                            keep=kept,
                        )
                    )
            cluster_name = settings.cluster
    if not quiet:
        print(stats.progress_line(), file=sys.stderr, flush=True)
    out: dict[str, object] = {**stats.summary(), "cluster": cluster_name, "db": store.url,
                              "keep": keep}  # fmt: skip
    if pruner is not None:
        out["retention"] = pruner.summary()
    return out | ({"state_dir": str(state)} if state is not None else {})


def _state_dir(configured: Path | None, db: str) -> Path | None:
    """--state-dir (KVSCOPE_STATE_DIR), else the store's default (None: an in-memory store)."""
    import os

    from collector.checkpoint import state_dir_for

    return configured if configured is not None else state_dir_for(db, os.environ)


def _local_state(
    state: Path | None, store_id: str, settings: Settings
) -> tuple[Spool, Checkpoints | None]:
    """The spool (``STATE/spool``) and the roll-up checkpoints (``STATE/rollup``)."""
    from collector.checkpoint import Checkpoints

    spool = _spool(state, store_id, settings)
    if state is None:
        return spool, None
    try:
        return spool, Checkpoints(state / "rollup", store_id=store_id)
    except OSError as exc:
        raise ConfigError(f"--state-dir {state}: {exc.strerror or exc}") from exc


def _spool(state: Path | None, store_id: str, settings: Settings) -> Spool:
    """Where windows the store refuses wait: ``STATE/spool`` (None: in memory only)."""
    from collector.spool import Spool

    return Spool(
        None if state is None else state / "spool",
        store_id=store_id,
        max_bytes=settings.spool_max_bytes,
        memory_records=settings.spool_memory_windows,
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
    from collector.health import CollectorHealth

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
    from collector.health import serve_metrics

    server = serve_metrics(addr, health.registry, what="--metrics-addr", check=health.alive)
    if not quiet:
        print(f"kvscope: collector metrics on {server.url}", file=sys.stderr, flush=True)
    return server


def _downsample(flag: str | None) -> dict[str, float | None]:
    """The settings override of --downsample-after (none given: the settings' own)."""
    if flag is None:
        return {}
    if flag.strip() == "never":
        return {"downsample_s": None}
    return {"downsample_s": retention_seconds(flag, "--downsample-after")}
