"""`kvscope serve`: the advisory API on uvicorn (one process); `kvscope openapi`: its schema."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from core.errors import ConfigError
from kvscope.commands.options import DbOpt

if TYPE_CHECKING:
    from api.settings import ApiSettings


def _serve(config: Any) -> None:
    """Run uvicorn until SIGTERM or SIGINT, stop gracefully, return (exit 0). uvicorn itself
    re-raises the signal after shutting down, so the process would die of it; `kvscope
    collect` exits 0 on SIGTERM too, and systemd reads either as a clean stop."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            stops = (signal.SIGINT, signal.SIGTERM)
            previous = {s: signal.signal(s, self.handle_exit) for s in stops}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    Server(config).run()


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """What `kvscope serve` runs: the API's settings (api.settings) and where uvicorn listens."""

    settings: ApiSettings
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "INFO"  # debug, info, warning or error (kept upper-case)

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_level", checked_level(self.port, self.log_level))


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
HostOpt = Annotated[str, typer.Option("--host", help="address to listen on")]
PortOpt = Annotated[int, typer.Option("--port", help="TCP port")]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        help="file whose first line is the bearer token for writes [default: "
        "KVSCOPE_API_TOKEN; none: writes disabled]",
    ),
]
LogLevelOpt = Annotated[str, typer.Option("--log-level", help="debug, info, warning or error")]


def checked_level(port: int, log_level: str) -> str:
    """``log_level`` upper-cased; ConfigError for a port outside 1..65535 or another level."""
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port must be in 1..65535, got {port}")
    level = log_level.upper()
    if level not in LOG_LEVELS:
        raise ConfigError(f"--log-level must be debug, info, warning or error: {log_level!r}")
    return level


def serve_cmd(
    db: DbOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    token_file: TokenFileOpt = None,
    log_level: LogLevelOpt = "info",
) -> None:
    """Serve the REST API: clusters, signals, stored plans, forecast, closed loop,
    report, what-if advice, cost model, scrape targets, /metrics.

    Settings beyond the flags come from the environment (KVSCOPE_READS_REQUIRE_TOKEN,
    KVSCOPE_ALLOWED_TARGET_NETWORKS, KVSCOPE_ADVISE_WORKERS, …; api/settings.py).
    Requests are logged without query string or headers.

    Example: kvscope serve --db sqlite:///kvscope.db --host 127.0.0.1 --port 8000
    --token-file /etc/kvscope/api-token
    """
    run_serve(serve_config(db=db, host=host, port=port, token_file=token_file,
                           log_level=log_level))  # fmt: skip


def serve_config(
    *, db: str | None, host: str, port: int, token_file: Path | None, log_level: str
) -> ServeConfig:
    """The flags and the environment checked once: --port, --log-level, then the settings."""
    from api.settings import load_settings

    level = checked_level(port, log_level)  # before the settings: a token file is read there
    settings = load_settings(db=db, api_token_file=token_file)
    return ServeConfig(settings=settings, host=host, port=port, log_level=level)


def run_serve(config: ServeConfig) -> None:
    """Build the app from ``config.settings`` and serve it until SIGTERM / SIGINT."""
    import uvicorn

    from api.app import create_app
    from store.store import redact

    settings, host, port, level = config.settings, config.host, config.port, config.log_level
    api = create_app(settings)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    writes = "enabled (bearer token)" if settings.token else "disabled (no token)"
    reads = "need the token" if settings.reads_require_token else "open"
    print(
        f"kvscope serve: http://{host}:{port} store {redact(settings.db)}; writes {writes}; "
        f"reads {reads}",
        file=sys.stderr,
        flush=True,
    )
    # access_log off: uvicorn's would print query strings; api.app logs without them.
    uv_config = uvicorn.Config(
        api, host=host, port=port, log_config=None, log_level=level.lower(), access_log=False
    )
    _serve(uv_config)


def openapi_cmd() -> None:
    """Print the API's OpenAPI document (JSON) on stdout.

    Example: kvscope openapi > openapi.json
    """
    from api.app import create_app
    from api.settings import load_settings

    typer.echo(json.dumps(create_app(load_settings()).openapi(), indent=2))


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
    app.command("openapi")(openapi_cmd)
