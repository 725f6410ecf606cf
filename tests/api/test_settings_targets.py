"""The API's settings (one factory, read when called; placeholder tokens refused) and target
registration's URL checks (collector.urlguard) as the API applies them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings, load_settings
from core.errors import ConfigError
from tests.api.conftest import AUTH, TOKEN, assert_error


def test_load_settings_reads_environment_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCOPE_DB", "sqlite:///from-env.db")
    monkeypatch.setenv("KVSCOPE_API_TOKEN", TOKEN)
    monkeypatch.setenv("KVSCOPE_READS_REQUIRE_TOKEN", "true")
    monkeypatch.setenv("KVSCOPE_ALLOWED_TARGET_NETWORKS", "10.0.0.0/8, 192.168.0.0/16")
    monkeypatch.setenv("KVSCOPE_ADVISE_WORKERS", "3")
    s = load_settings()
    assert (s.db, s.token, s.reads_require_token, s.advise_workers) == (
        "sqlite:///from-env.db", TOKEN, True, 3,
    )  # fmt: skip
    assert s.allowed_target_networks == ("10.0.0.0/8", "192.168.0.0/16")
    assert s.cache_ttl_s == 60.0 and s.advise_queue == 4
    assert TOKEN not in repr(s) and TOKEN not in str(s.model_dump())
    assert load_settings(db="sqlite:///flag.db").db == "sqlite:///flag.db"  # flags win


def test_load_settings_empty_token_means_writes_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCOPE_API_TOKEN", "")
    assert load_settings().token is None


def test_load_settings_token_file_first_line_read(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\nignored\n")
    s = load_settings(api_token_file=path)
    assert s.token == TOKEN and s.api_token_file is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"api_token": "changeme"}, "placeholder"),
        ({"api_token": "CHANGEME"}, "placeholder"),
        ({"api_token": "your-token-here"}, "placeholder"),
        ({"api_token": "short-token"}, "at least 16"),
        ({"api_token": "has a space in it 12345"}, "whitespace"),
        ({"reads_require_token": True}, "needs a token"),
        ({"allowed_target_networks": "10.0.0.1/8"}, "not a network"),
        ({"allowed_target_networks": "169.254.169.254/32"}, "metadata"),
        ({"advise_workers": 0}, "advise_workers"),
        ({"cache_ttl_s": -1}, "cache_ttl_s"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_load_settings_bad_value_config_error_without_the_value(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_settings(**overrides)
    token = overrides.get("api_token")
    assert not isinstance(token, str) or token not in str(err.value)


@pytest.mark.parametrize("token", ["", "changeme", "short"])
def test_load_settings_placeholder_token_file_refused(tmp_path: Path, token: str) -> None:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    with pytest.raises(ConfigError, match="api_token_file"):
        load_settings(api_token_file=path)


def test_load_settings_token_and_token_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    with pytest.raises(ConfigError, match="not both"):
        load_settings(api_token=TOKEN, api_token_file=path)


def test_create_app_applies_the_same_rules_to_direct_settings() -> None:
    with pytest.raises(ConfigError, match="needs a token"):
        create_app(ApiSettings(reads_require_token=True))


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:8000/metrics", "loopback"),
        ("http://localhost:8000/metrics", "loopback"),  # a name resolved to a refused address
        ("http://169.254.169.254/latest/meta-data", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("http://169.254.10.1/metrics", "link-local"),
        ("http://192.168.1.20:8000/metrics", "private"),
        ("http://2130706433/metrics", "127.0.0.1"),
        ("http://user:pw@10.0.0.5/metrics", "credentials"),
    ],
)
def test_register_target_unsafe_url_422_names_the_kind(
    sqlite_url: str, make_client: Callable[..., TestClient], url: str, kind: str
) -> None:
    c = make_client(sqlite_url, allowed_target_networks=("10.0.0.0/8",))
    resp = c.post("/v1/targets", json={"name": "t", "url": url}, headers=AUTH)
    body = assert_error(resp, 422, "url")
    assert kind in body["error"]
    assert c.get("/v1/targets").json() == {"targets": []}


def test_register_target_allowlisted_loopback_accepted_metadata_never(
    sqlite_url: str, make_client: Callable[..., TestClient]
) -> None:
    c = make_client(sqlite_url, allowed_target_networks=("127.0.0.0/8", "169.254.0.0/16"))
    ok = c.post("/v1/targets", json={"name": "local", "url": "http://127.0.0.1:9/metrics"},
                headers=AUTH)  # fmt: skip
    assert ok.status_code == 201, ok.text
    meta = {"name": "meta", "url": "http://169.254.169.254/"}
    assert "metadata" in assert_error(c.post("/v1/targets", json=meta, headers=AUTH), 422)["error"]
    assert [t["name"] for t in c.get("/v1/targets").json()["targets"]] == ["local"]


@pytest.mark.parametrize("url", ["ftp://10.0.0.5/metrics", "file:///etc/passwd", "10.0.0.5:80"])
def test_register_target_non_http_scheme_422(
    sqlite_url: str, make_client: Callable[..., TestClient], url: str
) -> None:
    c = make_client(sqlite_url, allowed_target_networks=("10.0.0.0/8",))
    assert_error(c.post("/v1/targets", json={"name": "t", "url": url}, headers=AUTH), 422, "url")
