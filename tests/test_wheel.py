"""The wheel, as `pip install kvscope` meets it.

Its file list: the five packages (collector, planner, dashboards, api, kvscope) and the
dist-info, nothing of benchmarks/ or tests/ (the accuracy study code never ships), and every
data file the packages read at run time (pyproject.toml [tool.setuptools.package-data]).
Then installed: a fresh venv holding only the wheel of kvscope, run from a directory outside
the checkout (`kvscope demo`, `kvscope simulate NAME`, every command's --help).

The wheel is built from a copy of the work tree's files (tracked, and untracked but not
ignored: what `pip install .` from this checkout would see) so that no stale build/ or
egg-info leaks into it and the checkout is left alone; `pip wheel --no-build-isolation`
uses the setuptools of the test extra, so nothing is downloaded (~3 s). The installed venv
gets kvscope's dependencies from this venv through a .pth line naming its site-packages:
a plain path line, so that directory's own .pth files (the editable install's finder of
this checkout) are not run and cannot shadow the wheel (checked).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from planner.simulate.scenarios import bundled_names
from tests.packages import PACKAGES

ROOT = Path(__file__).resolve().parents[1]
DATA_SUFFIXES = frozenset({".yaml", ".jsonl", ".md", ".json"})  # .json: dashboards/generated
STUDY_MODULES = frozenset({"accuracy", "fitsynth", "telemetry_gen"})  # benchmarks/accuracy/
RUN_TIME_DATA = (
    "planner/domain/data/hardware.yaml",  # planner.domain.hardware
    "planner/decide/DECIDER.md",  # kvscope advise --explain
    "planner/simulate/PARAMETERS.md",
    "planner/simulate/scenarios/trace.jsonl",  # trace_replay.yaml's relative path
    "planner/domain/data/sources.yaml",  # planner.domain.citations (kvscope sources, reasons)
    "dashboards/generated/kvscope-fleet-kv.json",  # the Grafana dashboards, as built
)
PIP_ENV = {"PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
# run from outside the checkout with nothing of the caller's Python set-up
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KVSCOPE_", "PIP_")) and k not in DROPPED_ENV
    }
    return {**env, **PIP_ENV, **extra}


def _git(*args: str) -> list[str]:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), *args, "-z"],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    return [p for p in proc.stdout.decode().split("\0") if p]


def _in_packages(rel: str) -> bool:
    return PurePosixPath(rel).parts[0] in PACKAGES


def _is_data(rel: str) -> bool:
    return not rel.endswith(".py")


@dataclass(frozen=True)
class Wheel:
    path: Path
    names: frozenset[str]  # the files in it, directories left out
    source: Path  # the copy it was built from
    build_s: float


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the wheel is built from its files)")
    tmp = tmp_path_factory.mktemp("wheel")
    src, out = tmp / "src", tmp / "dist"
    for rel in _git("ls-files", "--cached", "--others", "--exclude-standard"):
        path = ROOT / rel
        if path.is_file():  # not a file deleted in the work tree but still in the index
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / rel)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-index",
         "--no-build-isolation", "--check-build-dependencies", "-q", "-w", str(out)],
        capture_output=True, text=True, timeout=280, cwd=src, env=_clean_env(), check=False,
    )  # fmt: skip
    build_s = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("kvscope-*-py3-none-any.whl")
    with zipfile.ZipFile(path) as zf:
        names = frozenset(n for n in zf.namelist() if not n.endswith("/"))
    print(f"wheel built in {build_s:.1f} s: {path.name}, {len(names)} files")
    return Wheel(path, names, src, build_s)


def _dist_info(names: frozenset[str]) -> str:
    (top,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    return top


def test_wheel_holds_the_five_packages_and_the_dist_info_only(wheel: Wheel) -> None:
    tops = {n.split("/")[0] for n in wheel.names}
    dist_info = _dist_info(wheel.names)
    assert dist_info.startswith("kvscope-")
    assert tops == {*PACKAGES, dist_info}
    for pkg in PACKAGES:
        assert f"{pkg}/__init__.py" in wheel.names
    assert f"{dist_info}/entry_points.txt" in wheel.names


def test_wheel_has_no_benchmarks_tests_or_study_code(wheel: Wheel) -> None:
    for name in wheel.names:
        parts = PurePosixPath(name).parts
        assert parts[0] not in {"benchmarks", "tests", "examples", "build"}, name
        assert not STUDY_MODULES & {PurePosixPath(p).stem for p in parts}, name
        assert "__pycache__" not in parts and not name.endswith((".pyc", ".pyo")), name


def test_wheel_files_are_package_sources_or_their_data(wheel: Wheel) -> None:
    dist_info = _dist_info(wheel.names)
    for name in wheel.names:
        if name.startswith(f"{dist_info}/"):
            continue
        assert (wheel.source / name).is_file(), f"{name}: not a file of the checkout"
        if _is_data(name):
            assert PurePosixPath(name).suffix in DATA_SUFFIXES, f"{name}: not package data"


def test_wheel_holds_every_module_and_data_file_of_the_packages(wheel: Wheel) -> None:
    tracked = [r for r in _git("ls-files", "--cached") if _in_packages(r) and (ROOT / r).is_file()]
    assert tracked
    missing = sorted(set(tracked) - wheel.names)
    assert not missing, f"tracked files of the packages missing from the wheel: {missing}"
    data = set(RUN_TIME_DATA) | {f"planner/simulate/scenarios/{n}.yaml" for n in bundled_names()}
    assert not data - wheel.names, sorted(data - wheel.names)
    assert "planner/simulate/scenarios/__init__.py" in wheel.names  # importlib.resources


def test_wheel_metadata_spdx_license_and_console_script(wheel: Wheel) -> None:
    dist_info = _dist_info(wheel.names)
    with zipfile.ZipFile(wheel.path) as zf:
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "kvscope = kvscope.cli:main" in entry_points


# ------------------------------------------------------------------ installed from the wheel


@dataclass(frozen=True)
class Installed:
    venv: Path
    cwd: Path  # outside the checkout

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def kvscope(self) -> Path:
        return self.venv / "bin" / "kvscope"

    def env(self) -> dict[str, str]:
        return _clean_env(PATH=f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")

    def run(self, *args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in args], capture_output=True, text=True, timeout=timeout,
            cwd=self.cwd, env=self.env(), check=False,
        )  # fmt: skip


@pytest.fixture(scope="module")
def installed(wheel: Wheel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("installed")
    venv, cwd = tmp / "venv", tmp / "cwd"
    cwd.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120, env=_clean_env())  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--no-deps", "--no-index", "-q", str(wheel.path)],
        capture_output=True, text=True, timeout=280, env=_clean_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", purelib],
        capture_output=True, text=True, check=True, timeout=60, env=_clean_env(),
    ).stdout.strip()  # fmt: skip
    deps = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    # plain path lines: appended to sys.path after the venv's own site-packages; the .pth
    # files in those directories (the checkout's editable finder) are not processed
    Path(site, "_kvscope_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    yield Installed(venv, cwd)


WHERE = """
import importlib.util, json, sys
import api, collector, dashboards, kvscope, planner
print(json.dumps({
    "files": {m.__name__: m.__file__ for m in (api, collector, dashboards, kvscope, planner)},
    "meta_path": [getattr(f, "__module__", type(f).__module__) for f in sys.meta_path],
    "found": [n for n in ("benchmarks", "tests") if importlib.util.find_spec(n)],
}))
"""


def test_installed_kvscope_is_the_wheel_not_the_checkout(installed: Installed) -> None:
    proc = installed.run(installed.python, "-c", WHERE)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    for module, file in got["files"].items():
        assert Path(file).is_relative_to(installed.venv), (module, file)
    assert not [m for m in got["meta_path"] if "editable" in m], got["meta_path"]
    assert got["found"] == []  # nothing of the checkout importable


COMMANDS = """
import json, typer.main
from kvscope.cli import app
def walk(cmd, path):
    yield path
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from walk(sub, [*path, name])
print(json.dumps(list(walk(typer.main.get_command(app), []))))
"""


@pytest.mark.slow  # ~15-30 s: `make test-slow` (and CI) runs it
def test_installed_every_command_and_subcommand_help_exits_0(installed: Installed) -> None:
    proc = installed.run(installed.python, "-c", COMMANDS)
    assert proc.returncode == 0, proc.stderr
    paths = json.loads(proc.stdout)
    here = subprocess.run([sys.executable, "-c", COMMANDS], capture_output=True, text=True,
                          check=True, timeout=60, cwd=ROOT, env=_clean_env())  # fmt: skip
    assert paths == json.loads(here.stdout)  # every command of the checkout is installed
    assert ["simulate"] in paths and ["demo"] in paths and len(paths) > 5

    def help_of(path: list[str]) -> tuple[list[str], subprocess.CompletedProcess[str]]:
        return path, installed.run(installed.kvscope, *path, "--help", timeout=60)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for path, done in pool.map(help_of, paths):
            assert done.returncode == 0, (path, done.stderr)
            assert "Usage: kvscope" in done.stdout, path


def test_installed_simulate_bundled_scenarios_match_the_checkout(installed: Installed) -> None:
    for name in ("shared_prefix", "trace_replay"):  # trace_replay reads trace.jsonl beside it
        proc = installed.run(installed.kvscope, "simulate", name, "--json")
        assert proc.returncode == 0, proc.stderr
        here = subprocess.run(
            [sys.executable, "-m", "kvscope.cli", "simulate", name, "--json"],
            capture_output=True, text=True, timeout=120, cwd=ROOT, env=_clean_env(),
            check=True,
        )  # fmt: skip
        got, want = json.loads(proc.stdout), json.loads(here.stdout)
        got.pop("wall_s"), want.pop("wall_s")
        assert got == want, name  # same seed, same numbers
    listed = installed.run(installed.kvscope, "simulate", "--list")
    assert listed.returncode == 0, listed.stderr
    assert [r.split()[0] for r in listed.stdout.splitlines()] == list(bundled_names())
    assert all(
        Path(r.split()[1]).is_relative_to(installed.venv) for r in listed.stdout.splitlines()
    )
    unknown = installed.run(installed.kvscope, "simulate", "nosuch")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr.startswith("kvscope: error: nosuch: no such scenario file nor bundled")


@pytest.mark.slow  # ~15-30 s: `make test-slow` (and CI) runs it
def test_installed_demo_prints_a_decision(installed: Installed) -> None:
    proc = installed.run(installed.kvscope, "demo", "--sim-hours", "0.5", "--speed", "1000",
                         timeout=280)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Decision: " in proc.stdout and "[4/4 plots]" in proc.stderr
    assert (installed.cwd / "out" / "demo.db").is_file()
    assert list((installed.cwd / "out").glob("*.png"))
