"""kvscope.commands.plan.plan_config and kvscope.replan.ReplanConfig: checked once, each error
naming its flag."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from kvscope.commands.plan import PlanFlags, plan_config
from kvscope.replan import ReplanConfig
from store.store import Store


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for key in [k for k in os.environ if k.startswith("KVSCOPE_")]:
        monkeypatch.delenv(key)
    url = f"sqlite:///{tmp_path / 'k.db'}"
    Store(url).migrate()
    return url


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"since": "yesterday"}, "--since: 'yesterday' is not a duration"),
        ({"horizon": "0"}, "--horizon: must be greater than 0"),
        ({"slo_ttft": "fast"}, "--slo-quantile: --slo-ttft: 'fast' is not a duration"),
        ({"slo_quantile": "p75"}, "--slo-quantile: "),
        ({"every": "soon"}, "--every: 'soon' is not a duration"),
        ({"every": "0"}, "--every: must be greater than 0"),
        ({"every": "1m", "plots": Path("p")}, "--plots cannot be used with --every"),
        ({"db": "sqlite:///no/such/k.db"}, "--db sqlite:///no/such/k.db: no such SQLite file"),
    ],
)
def test_plan_config_bad_flag_raises_config_error_naming_it(
    db: str, flags: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        plan_config(PlanFlags(**{"db": db} | flags))
    assert str(info.value).startswith(message), str(info.value)


def test_plan_config_every_builds_the_replan_loop(db: str) -> None:
    config = plan_config(PlanFlags(db=db, every="15m", since="3h", cluster="c", save=False))
    assert config.every == ReplanConfig(every_s=900.0, cluster="c", since_s=10_800.0)
    assert (config.db, config.since_s, config.horizon_s) == (db, 10_800.0, 7 * 86_400.0)
    assert (config.slo.ttft_s, config.slo.quantile) == (2.0, "p90")


def test_plan_config_since_all_is_none_and_no_loop(db: str) -> None:
    config = plan_config(PlanFlags(db=db, since=" all ", plots=Path("p")))
    assert config.since_s is None and config.every is None and config.plots == Path("p")


@pytest.mark.parametrize("every_s", [0.0, -1.0, math.inf, math.nan])
def test_replan_config_bad_every_raises_config_error(every_s: float) -> None:
    with pytest.raises(ConfigError, match=r"^--every must be a positive duration, got "):
        ReplanConfig(every_s)
