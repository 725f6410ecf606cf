"""core.durations: the one duration grammar of the CLI and the API (a table of good and
malformed inputs; every duration the API's pattern accepts reads the same), and how one is
written for people."""

from __future__ import annotations

import itertools
import re

import pytest

from core.durations import API_PATTERN, API_UNITS, UNITS, format_duration, parse_duration
from core.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("15s", 15.0), ("15", 15.0), ("1m", 60.0), (" 2h ", 7200.0),
     ("1.5d", 129_600.0), ("1w", 604_800.0), ("0.25 s", 0.25)],
)  # fmt: skip
def test_parse_duration_reads_each_unit(text: str, seconds: float) -> None:
    assert parse_duration(text, "--x") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "is not a duration"), ("15x", "is not a duration"), ("-1m", "is not a duration"),
     ("1e3s", "is not a duration"), ("m", "is not a duration"), ("1 m s", "is not a duration"),
     ("nan", "is not a duration"), ("0", "must be greater than 0"), ("0ms", "greater than 0")],
)  # fmt: skip
def test_parse_duration_refuses_naming_the_flag(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^--since: .*{message}"):
        parse_duration(text, "--since")


def test_zero_allowed_only_when_asked() -> None:
    assert parse_duration("0s", "--settle", allow_zero=True) == 0.0


def test_every_api_duration_is_a_cli_duration_of_the_same_seconds() -> None:
    pattern = re.compile(API_PATTERN)
    assert set(API_UNITS) <= set(UNITS)
    for n, unit in itertools.product((1, 7, 15, 60, 999, 9999), API_UNITS):
        text = f"{n}{unit}"
        assert pattern.match(text)
        assert parse_duration(text, "since") == n * UNITS[unit]  # by hand, unit by unit
    for bad in ("0s", "10000s", "1ms", "1.5h", " 1h", "1", "01m"):
        assert not pattern.match(bad), bad


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "n/a"), (float("nan"), "n/a"), (float("inf"), "n/a"), (0.0, "now"), (-5.0, "now"),
     (5400.0, "1.5 h"), (86_399.0, "24.0 h"), (86_400.0, "1.0 d"), (3 * 86_400.0, "3.0 d")],
)  # fmt: skip
def test_format_duration_hours_below_a_day_days_from_one(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text
