"""kvscope.commands.serve.serve_config: --port, --log-level and the API's settings checked once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from api.settings import ApiSettings
from core.errors import ConfigError
from kvscope.commands.serve import ServeConfig, serve_config


@pytest.fixture(autouse=True)
def _no_kvscope_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("KVSCOPE_")]:
        monkeypatch.delenv(key)


@pytest.mark.parametrize(
    ("port", "log_level", "token", "message"),
    [
        (0, "info", None, "--port must be in 1..65535, got 0"),
        (65536, "info", None, "--port must be in 1..65535, got 65536"),
        (8000, "verbose", None, "--log-level must be debug, info, warning or error: 'verbose'"),
        (0, "verbose", None, "--port must be in 1..65535, got 0"),  # the port first
        (8000, "info", "changeme", "the token is a placeholder value"),
        (8000, "info", "short", "the token must be at least 16 characters"),
        (8000, "info", "", "cannot read"),  # no such file
        (0, "info", "", "--port must be in 1..65535"),  # before the token file is read
    ],
)
def test_serve_config_bad_flag_raises_config_error_naming_it(
    tmp_path: Path, port: int, log_level: str, token: str | None, message: str
) -> None:
    token_file = None
    if token is not None:
        token_file = tmp_path / "token"
        if token:
            token_file.write_text(token + "\n")
    with pytest.raises(ConfigError) as info:
        serve_config(db=None, host="127.0.0.1", port=port, token_file=token_file,
                     log_level=log_level)  # fmt: skip
    assert message in str(info.value), str(info.value)
    assert not token or token not in str(info.value)  # the message never shows the token


def test_serve_config_reads_the_token_once_and_upper_cases_the_level(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("a" * 32 + "\n")
    config = serve_config(db="sqlite://", host="0.0.0.0", port=9000,
                          token_file=tmp_path / "token", log_level="warning")  # fmt: skip
    assert (config.host, config.port, config.log_level) == ("0.0.0.0", 9000, "WARNING")
    assert config.settings.token == "a" * 32 and config.settings.api_token_file is None
    assert config.settings.db == "sqlite://"


@pytest.mark.parametrize(("port", "level"), [(-1, "INFO"), (70000, "INFO"), (80, "TRACE")])
def test_serve_config_built_directly_is_checked_too(port: int, level: str) -> None:
    with pytest.raises(ConfigError, match=r"^--port|^--log-level"):
        ServeConfig(settings=ApiSettings(), port=port, log_level=level)
    assert ServeConfig(settings=ApiSettings(), log_level="debug").log_level == "DEBUG"
