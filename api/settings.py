"""The API's settings: one factory, :func:`load_settings`, read when called (never at import).

Every field can be set as ``KVSCOPE_<NAME>`` in the environment (``KVSCOPE_DB``,
``KVSCOPE_API_TOKEN``, ``KVSCOPE_API_TOKEN_FILE``, ``KVSCOPE_READS_REQUIRE_TOKEN``,
``KVSCOPE_ALLOWED_TARGET_NETWORKS`` as a comma list of CIDRs, …) or passed to the factory.

The token guards writes (and reads when ``reads_require_token``). It is a SecretStr, so no
repr, log line or validation message ever shows it, and a placeholder (``changeme``, …) or a
short token is refused: a guessable token is worse than none, which keeps writes disabled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from collector.urlguard import parse_allowlist, split_allowlist
from core.errors import ConfigError

MIN_TOKEN_CHARS = 16
# Values seen in sample configs and docs; a token equal to one of them (any case) is refused.
PLACEHOLDER_TOKENS = frozenset(
    {
        "changeme", "change-me", "change_me", "changeit", "secret", "password", "token",
        "default", "placeholder", "example", "test", "admin", "kvscope", "your-token-here",
        "your_token_here", "<token>", "xxx", "none", "null",
    }
)  # fmt: skip


class ApiSettings(BaseSettings):
    """Settings of `kvscope serve` / create_app (module docstring)."""

    model_config = SettingsConfigDict(env_prefix="KVSCOPE_", extra="forbid")

    db: str = Field(
        default="sqlite:///kvscope.db", min_length=1, description="SQLAlchemy URL of the store"
    )
    api_token: SecretStr | None = Field(
        default=None, description="bearer token for writes (and reads when reads_require_token)"
    )
    api_token_file: Path | None = Field(
        default=None, description="file holding the token (first line); exclusive with api_token"
    )
    reads_require_token: bool = Field(default=False, description="reads need the token too")
    allowed_target_networks: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="CIDRs target URLs may point into although private or loopback "
        "(e.g. 10.0.0.0/8); link-local and metadata addresses stay refused",
    )
    advise_workers: int = Field(default=2, ge=1, le=64, description="threads running advise/report")
    advise_queue: int = Field(
        default=4, ge=0, le=1024, description="heavy requests waiting beyond the workers; then 429"
    )
    cache_ttl_s: float = Field(default=60.0, ge=0, le=86_400, description="what-if cache lifetime")
    cache_entries: int = Field(default=256, ge=1, le=100_000, description="what-if cache size")
    retry_after_s: int = Field(default=5, ge=1, le=3_600, description="Retry-After of a 429, floor")
    forecast_seconds: float = Field(
        default=8.0, gt=0, le=600, description="time budget of each forecast of the report's plan"
    )

    @field_validator("allowed_target_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: Any) -> Any:
        return split_allowlist(value)

    @field_validator("allowed_target_networks")
    @classmethod
    def _check_networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        try:
            parse_allowlist(value)  # the guard's own rules (no metadata address, no host bits)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        return value

    @field_validator("api_token", "api_token_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("api_token")
    @classmethod
    def _check_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_token(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _one_token_source(self) -> ApiSettings:
        if self.api_token is not None and self.api_token_file is not None:
            raise ValueError("set api_token or api_token_file, not both")
        return self

    @property
    def token(self) -> str | None:
        """The configured token (from the setting or the file), None: writes disabled."""
        if self.api_token is not None:
            return self.api_token.get_secret_value()
        return None


def check_token(token: str) -> None:
    """ValueError for a token too short, a placeholder or with whitespace inside (the message
    never repeats the token)."""
    if token.strip().lower() in PLACEHOLDER_TOKENS:
        raise ValueError("the token is a placeholder value: generate one (openssl rand -hex 32)")
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the token must be at least {MIN_TOKEN_CHARS} characters")
    if any(ch.isspace() for ch in token):
        raise ValueError("the token must not contain whitespace")


def _read_token_file(path: Path) -> SecretStr:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"api_token_file {path}: cannot read: {exc.strerror or exc}") from exc
    lines = text.splitlines()
    token = lines[0].strip() if lines else ""
    try:
        check_token(token)
    except ValueError as exc:
        raise ConfigError(f"api_token_file {path}: {exc}") from exc
    return SecretStr(token)


def load_settings(**overrides: Any) -> ApiSettings:
    """Settings from the environment with explicit overrides (None values ignored); the token
    file, when given, is read now. ConfigError names the setting, never its value."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = ApiSettings(**clean)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        raise ConfigError(f"{where}: {first['msg']}") from None
    return resolve(settings)


def resolve(settings: ApiSettings) -> ApiSettings:
    """The settings with the token file read (once) and the cross-setting rules checked:
    create_app calls it too, so settings built directly obey the same rules."""
    if settings.api_token_file is not None:
        token = _read_token_file(settings.api_token_file)
        settings = settings.model_copy(update={"api_token": token, "api_token_file": None})
    if settings.reads_require_token and settings.token is None:
        raise ConfigError("reads_require_token: needs a token (KVSCOPE_API_TOKEN or --token-file)")
    return settings
