"""The one exception tree of kvscope (every package raises these, never a bare ValueError)."""

from __future__ import annotations


class KvscopeError(Exception):
    """Base of every error kvscope raises on purpose."""


class ConfigError(KvscopeError):
    """A setting, a targets file or a scenario file is wrong; the message names the key."""


class InputError(ConfigError):
    """One input failed a domain check; ``field`` is its key ("model", "tp", "tiers"), which
    the API returns as the error body's ``field``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class URLRefused(ConfigError):
    """collector.urlguard refused a target URL; ``kind`` says why ("loopback", "scheme", …)."""

    def __init__(self, url: str, kind: str, message: str) -> None:
        super().__init__(f"target URL {url} refused: {message}")
        self.url = url
        self.kind = kind


class ScrapeError(KvscopeError):
    """A target could not be scraped (connect, timeout, HTTP status, body too large)."""

    def __init__(self, target: str, kind: str, message: str) -> None:
        super().__init__(f"{target}: {kind}: {message}")
        self.target = target
        self.kind = kind


class ParseError(KvscopeError):
    """An exposition is malformed; names the target and the 1-based line."""

    def __init__(self, target: str, line: int, message: str) -> None:
        super().__init__(f"{target}:{line}: {message}")
        self.target = target
        self.line = line
        self.reason = message


class StoreError(KvscopeError):
    """The SQL store refused an operation (bad URL, schema out of date, constraint)."""


class InsufficientHistory(KvscopeError):
    """A fit or forecast needs more history than the store holds."""

    def __init__(self, what: str, required: int, available: int) -> None:
        super().__init__(
            f"{what}: needs at least {required} windows of history, {available} available"
        )
        self.what = what
        self.required = required
        self.available = available
