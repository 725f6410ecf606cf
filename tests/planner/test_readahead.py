"""planner.plan.readahead: a plan of the windows a child read ahead is the plan of the windows
read in one process (also when the child dies midway), and FIT_MODULES names what the fits
import when they first run."""

from __future__ import annotations

import ast
import importlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.plan import build_plan
from planner.plan import readahead as ra
from planner.plan.fork import JOBS_ENV
from planner.plan.windows import SignalPart, signal_parts
from store.store import Store
from tests.planner.synthstore import fill_store, shifted_frame, sqlite_url, without_timings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = sqlite_url(tmp_path_factory.mktemp("readahead") / "synth.db")
    fill_store(url, shifted_frame())
    return url


@pytest.fixture(autouse=True)
def _stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JOBS_ENV, raising=False)
    monkeypatch.setattr("planner.plan.fork._cpus", lambda: 2)
    # threads other tests of the session left running would turn the child off
    monkeypatch.setattr("planner.plan.fork._threads", lambda: 1)


def _plan_json(url: str, parts: object = None) -> str:
    with Store(url) as store:
        plan = build_plan(store, cluster="synth", forecast_seconds=1, parts=parts)  # type: ignore[arg-type]
    doc = without_timings(plan.to_dict())
    return json.dumps(doc, sort_keys=True)


def test_plan_of_windows_read_ahead_equals_the_plan_read_here(store_url: str) -> None:
    ahead = ra.read_ahead(store_url, lambda _s: "synth", since=None, until=None)
    assert ahead is not None and ahead.forked and ahead.pid != os.getpid()
    assert _plan_json(store_url, ahead) == _plan_json(store_url)
    assert ahead.pid == 0 and ahead.taken == len(list(_parts_here(store_url)))


def _parts_here(url: str) -> Iterator[SignalPart]:
    with Store(url) as store:
        yield from signal_parts(store, cluster="synth", since=None, until=None)


def test_plan_whose_reading_child_dies_midway_equals_the_plan_read_here(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    parent, read = os.getpid(), Store.read_frame
    calls = {"n": 0}

    def read_then_die(self: Store, **kwargs: object) -> object:
        calls["n"] += 1
        if os.getpid() != parent and calls["n"] == 6:  # the OOM killer, in the 6th read
            os.kill(os.getpid(), signal.SIGKILL)
        return read(self, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "read_frame", read_then_die)
    ahead = ra.read_ahead(store_url, lambda _s: "synth", since=None, until=None)
    assert ahead is not None and ahead.forked
    assert _plan_json(store_url, ahead) == _plan_json(store_url)
    assert "after 5 item(s); reading the rest in this process" in caplog.text


def test_child_error_reaches_the_plan_naming_what_was_wrong(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "empty.db")
    Store(url).close()  # a file with no kvscope schema
    ahead = ra.read_ahead(url, lambda _s: None, since=None, until=None)
    assert ahead is not None
    with pytest.raises(Exception, match=r"no kvscope schema: run `kvscope db migrate"):
        list(ahead)


def test_no_read_ahead_where_no_child_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JOBS_ENV, "1")
    assert ra.read_ahead("sqlite:///unused.db", lambda _s: None, since=None, until=None) is None


def _startup_imports() -> set[str]:
    """statsmodels / scipy modules imported inside planner's functions (the "start-up"
    deferred imports)."""
    found = set()
    for path in (ROOT / "planner").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.module:
                    names = [inner.module] + [f"{inner.module}.{a.name}" for a in inner.names]
                elif isinstance(inner, ast.Import):
                    names = [a.name for a in inner.names]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] in ("statsmodels", "scipy") and _is_module(name):
                        found.add(name)
    return found


def _is_module(name: str) -> bool:
    import importlib.util  # noqa: PLC0415 - only this helper needs it

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_fit_modules_are_what_planner_imports_when_a_fit_first_runs() -> None:
    found = _startup_imports()
    assert found, "the scan found no deferred import: it is broken"
    # a module and its package: the deepest one imported is what must be loaded
    deepest = {m for m in found if not any(o.startswith(m + ".") for o in found)}
    assert set(ra.FIT_MODULES) == deepest


def test_load_fit_modules_imports_every_one() -> None:
    ra.load_fit_modules()
    assert all(name in sys.modules for name in ra.FIT_MODULES)


def test_the_reading_child_starts_before_the_fits_are_imported() -> None:
    # `kvscope plan` checks its flags and imports the reading path, then forks the child:
    # none of that may import the fits, the verdicts or the forecasts (they load meanwhile)
    code = (
        "import sys; import kvscope.commands.plan as p; "
        "p.plan_config(p.PlanFlags(db='sqlite://', since='all')); "
        "import kvscope.heap, planner.plan.readahead, store.store; "
        "print(' '.join(sorted(sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()  # fmt: skip
    assert "planner.plan.windows" in out, "the check no longer imports the reading path"
    heavy = ("planner.fit", "planner.plan.build", "planner.plan.observe", "planner.forecast",
             "planner.plan.verdict", "statsmodels", "scipy")  # fmt: skip
    assert [m for m in out if m.startswith(heavy)] == []


def test_the_plan_packages_names_each_load_from_its_module() -> None:
    pkg = importlib.import_module("planner.plan")
    for name in pkg.__all__:
        home = importlib.import_module(f"planner.plan.{pkg._HOME[name]}")
        assert getattr(pkg, name) is getattr(home, name)
    assert set(pkg.__all__) == set(pkg._HOME)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pkg.nope  # noqa: B018
