"""The local stack (docker-compose.yml, Dockerfile, deploy/ configs), checked without a
Docker engine: what can go wrong before `docker-compose up` and is invisible to it.

- Debian's docker-compose 1.29 accepts the file (`config`) with the secrets set, and refuses
  it naming the secret when one is missing: there is no default password;
- every bind-mounted host path exists and is mounted read-only, every named volume is
  declared; images are pinned to exact versions; published ports are bound to 127.0.0.1
  and reach a port the service listens on; every service has a healthcheck probing its own
  port (the one-shot `migrate` none, and is waited for as completed);
- each kvscope service's command parses with kvscope's own CLI (flags and values, through
  the Typer app's click command) and its flags are in `kvscope … --help`;
- Prometheus' config passes `promtool check config` with the mounted generated rules and
  scrapes exactly the simulated scenario's endpoints and kvscope's services under the job
  names the rules select; Alertmanager's passes `amtool check-config` and routes to the
  webhook; Grafana's provisioning names the mounted dashboards and a fixed datasource uid;
- the webhook logger answers and logs a real Alertmanager notification and rejects
  malformed bodies with a 4xx, logged, without stopping.

Whole module: a few seconds (the compose and CLI subprocesses run concurrently).
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import os
import posixpath
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.core import TyperGroup
from typer.testing import CliRunner

from dashboards.alerts import ALERTS
from dashboards.config import DEFAULT
from dashboards.generate import RULES_DIR, artifacts
from kvscope.cli import app
from planner.simulate.cluster import Simulation
from planner.simulate.scenario import parse_scenario, read_scenario_file
from planner.simulate.scenarios import scenario_file
from tests.clirun import run_kvscope
from tests.services import free_port

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTMANAGER_YML = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
WEBHOOK = ROOT / "deploy" / "alertmanager" / "webhook_logger.py"
GRAFANA = ROOT / "deploy" / "grafana" / "provisioning"
DOCKER_COMPOSE = shutil.which("docker-compose")
SECRETS = ("POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD", "KVSCOPE_API_TOKEN")
KVSCOPE_IMAGE = "kvscope"
# Ports the third-party images listen on by default (the compose file does not move them).
IMAGE_PORTS = {"prom/prometheus": 9090, "prom/alertmanager": 9093, "grafana/grafana": 3000,
               "postgres": 5432}  # fmt: skip
# PostgreSQL >= 10 numbers releases major.minor: postgres:15.13 is an exact release.
TWO_PART_VERSIONS = frozenset({"postgres"})
SCRAPE_JOBS = {"vllm", "lmcache", "kvscope-collector", "kvscope-api"}

needs_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="Debian's docker-compose 1.29 is not installed (`make test` apt-installs it)",
)


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


RAW: dict[str, Any] = _load(COMPOSE)  # merge keys (<<: *kvscope) resolved by the loader
SERVICES: dict[str, dict[str, Any]] = RAW["services"]


def _image(service: Mapping[str, Any]) -> tuple[str, str]:
    name, _, tag = str(service["image"]).partition(":")
    return name, tag


def _is_kvscope(service: Mapping[str, Any]) -> bool:
    return _image(service)[0] == KVSCOPE_IMAGE


def _one_shot(service: Mapping[str, Any]) -> bool:
    return service.get("restart") == "no"


# ----------------------------------------------------------------------- docker-compose config


def _compose(env_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """docker-compose with only this env file: no variable from the caller's environment
    (a shell's POSTGRES_PASSWORD would hide a missing one) nor from a ./.env."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    assert DOCKER_COMPOSE is not None
    return subprocess.run(
        [DOCKER_COMPOSE, "--env-file", str(env_file), "-f", str(COMPOSE), *args],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


def _secret_values() -> dict[str, str]:
    return {name: secrets.token_hex(16) for name in SECRETS}  # what .env.example asks for


def _env_file(path: Path, values: Mapping[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()), encoding="utf-8")
    return path


@dataclass(frozen=True, slots=True)
class ComposeRuns:
    values: dict[str, str]
    full: subprocess.CompletedProcess[str]  # every secret set
    example: subprocess.CompletedProcess[str]  # .env.example as shipped: every secret empty


@pytest.fixture(scope="module")
def compose_runs(tmp_path_factory: pytest.TempPathFactory) -> ComposeRuns:
    values = _secret_values()
    full = _env_file(tmp_path_factory.mktemp("compose") / "full.env", values)
    with ThreadPoolExecutor(2) as pool:
        ok = pool.submit(_compose, full, "config")
        example = pool.submit(_compose, ENV_EXAMPLE, "config", "-q")
        return ComposeRuns(values, ok.result(), example.result())


@pytest.fixture(scope="module")
def resolved(compose_runs: ComposeRuns) -> dict[str, Any]:
    """The file as docker-compose reads it: variables substituted, paths made absolute."""
    assert compose_runs.full.returncode == 0, compose_runs.full.stderr
    doc: dict[str, Any] = yaml.safe_load(compose_runs.full.stdout)
    return doc


@needs_compose
def test_compose_config_with_every_secret_set_is_valid(
    compose_runs: ComposeRuns, resolved: dict[str, Any]
) -> None:
    assert compose_runs.full.returncode == 0, compose_runs.full.stderr
    assert "is not set" not in compose_runs.full.stderr  # no `$VAR` left without a default
    assert set(resolved["services"]) == set(SERVICES)
    env = resolved["services"]["api"]["environment"]
    assert env["KVSCOPE_API_TOKEN"] == compose_runs.values["KVSCOPE_API_TOKEN"]
    password = compose_runs.values["POSTGRES_PASSWORD"]
    assert f":{password}@postgres:5432/" in env["KVSCOPE_DB"]


@needs_compose
def test_compose_config_with_the_env_example_as_shipped_fails_naming_a_secret(
    compose_runs: ComposeRuns,
) -> None:
    # docker-compose stops at the first missing one; every secret is `:?` wherever it is
    # used (the next test), so each is enforced alike
    proc = compose_runs.example
    assert proc.returncode != 0, "the example's empty secrets must not start the stack"
    named = re.findall(r"set (\w+) in \.env", proc.stderr)
    assert named and set(named) <= set(SECRETS), proc.stderr


def test_compose_variables_are_required_secrets_or_have_defaults() -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    assert not re.search(r"\$(?![{$])", text), "a bare $VAR: write ${VAR:-default}"
    refs = re.findall(r"\$\{(\w+)(:[?-])?", text)
    assert refs
    required = {name for name, op in refs if op == ":?"}
    assert required == set(SECRETS)
    assert all(op == ":?" for name, op in refs if name in SECRETS), "a secret with a default"
    assert all(op for _, op in refs), "a ${VAR} without :- or :? is silently empty when unset"
    example = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            example[key] = value
    assert example == dict.fromkeys(SECRETS, ""), "the example lists the secrets, unset"
    optional = {name for name, op in refs if op == ":-"}
    documented = set(re.findall(r"^# (\w+)=", ENV_EXAMPLE.read_text(encoding="utf-8"), re.M))
    assert optional <= documented, optional - documented


def test_compose_secrets_have_no_default_anywhere() -> None:
    for name, service in SERVICES.items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|TOKEN|SECRET", key):
                assert re.fullmatch(r"\$\{\w+:\?[^}]+\}", str(value)), (name, key)
            if key == "KVSCOPE_DB":
                assert "${POSTGRES_PASSWORD:?" in str(value), (name, key)
    assert SERVICES["grafana"]["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def test_compose_has_no_top_level_name_or_version() -> None:
    # docker-compose 1.29 rejects `name:`; `version:` is obsolete in Compose v2
    assert not {"name", "version"} & set(RAW)


# ----------------------------------------------------------------------- mounts


@dataclass(frozen=True, slots=True)
class Mount:
    kind: str  # bind | volume
    source: str
    target: str
    read_only: bool


def parse_mount(entry: str | Mapping[str, Any]) -> Mount:
    """One `volumes:` entry, short (`SRC:DST[:MODE]`) or long syntax; a short source that
    is not a path (./, ../, /, ~) is a named volume, as compose reads it."""
    if isinstance(entry, str):
        parts = entry.split(":")
        if len(parts) == 1:  # an anonymous volume at this container path
            return Mount("volume", "", parts[0], read_only=False)
        source, target, *mode = parts
        kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        flags = set(mode[0].split(",")) if mode else set()
        return Mount(kind, source, target, read_only="ro" in flags)
    return Mount(
        str(entry["type"]), str(entry.get("source", "")), str(entry["target"]),
        read_only=bool(entry.get("read_only", False)),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("./deploy/x.yml:/etc/x.yml:ro", Mount("bind", "./deploy/x.yml", "/etc/x.yml", True)),
        ("/abs:/data", Mount("bind", "/abs", "/data", False)),
        ("data:/var/lib/x", Mount("volume", "data", "/var/lib/x", False)),
        ("data:/var/lib/x:ro,z", Mount("volume", "data", "/var/lib/x", True)),
        ("/only/in/container", Mount("volume", "", "/only/in/container", False)),
        ({"type": "bind", "source": "./a", "target": "/a", "read_only": True},
         Mount("bind", "./a", "/a", True)),
        ({"type": "volume", "source": "data", "target": "/d"},
         Mount("volume", "data", "/d", False)),
    ],
)  # fmt: skip
def test_parse_mount_short_and_long_syntax_gives_kind_source_target(
    entry: str | dict[str, Any], expected: Mount
) -> None:
    assert parse_mount(entry) == expected


def _mounts(service: Mapping[str, Any]) -> list[Mount]:
    return [parse_mount(v) for v in service.get("volumes") or []]


def test_compose_bind_mounts_exist_in_the_repo_and_are_read_only() -> None:
    binds = 0
    for name, service in SERVICES.items():
        for mount in _mounts(service):
            if mount.kind == "bind":
                binds += 1
                assert (ROOT / mount.source).exists(), f"{name}: {mount.source} is not in the repo"
                assert mount.read_only, f"{name}: {mount.source} is mounted writable"
            else:
                assert mount.source in (RAW.get("volumes") or {}), f"{name}: {mount.source}"
    assert binds >= 6


def _bind_target(service: str, source: str) -> str:
    """The container path where ``service`` mounts the repo path ``source``."""
    for mount in _mounts(SERVICES[service]):
        if mount.kind == "bind" and (ROOT / mount.source).resolve() == (ROOT / source).resolve():
            return mount.target
    raise AssertionError(f"{service} does not mount {source}")


# ----------------------------------------------------------------------- images, ports, health


def image_is_pinned(image: str) -> bool:
    """An exact release (`prom/prometheus:v2.53.4`, `python:3.11.13-slim-bookworm`) or a
    digest; never `latest`, a bare name or a floating `3.11-slim` / `15`."""
    if re.fullmatch(r"[\w./-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}", image):
        return True
    name, _, tag = image.partition(":")
    parts = 2 if name in TWO_PART_VERSIONS else 3
    return bool(re.fullmatch(rf"v?\d+(\.\d+){{{parts - 1}}}([-+][\w.-]+)?", tag))


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        ("prom/prometheus:v2.53.4", True), ("python:3.11.13-slim-bookworm", True),
        ("postgres:15.13", True), ("grafana/grafana:12.2.1", True),
        ("python:3.11@sha256:" + "a" * 64, True),
        ("prom/prometheus:latest", False), ("grafana/grafana", False),
        ("python:3.11-slim", False), ("postgres:15", False), ("grafana/grafana:12.2", False),
        ("prom/alertmanager:main", False),
    ],
)  # fmt: skip
def test_image_is_pinned_accepts_only_exact_releases(image: str, pinned: bool) -> None:
    assert image_is_pinned(image) is pinned


def test_compose_images_are_pinned_and_kvscope_is_this_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "version"
    ]
    for name, service in SERVICES.items():
        image = str(service["image"])
        assert image_is_pinned(image), f"{name}: {image} is not pinned to a release"
        if _is_kvscope(service):
            assert _image(service)[1] == version, f"{name}: {image} is not kvscope {version}"
            assert service.get("build") == ".", name
        else:
            assert "build" not in service, name


def _listen_ports(name: str, service: Mapping[str, Any]) -> set[int]:
    """The container ports ``service`` listens on, read from its command (kvscope's flags
    as its CLI parses them, the webhook's --port) or its image's default."""
    if _is_kvscope(service):
        _, params = _kvscope_params(service["command"], _defaults())
        if "serve" in params and params.get("serve"):  # simulate --serve HOST:PORT
            base = int(str(params["serve"]).rsplit(":", 1)[1])
            return set(range(base, base + _sim_endpoints()[0] + _sim_endpoints()[1]))
        if params.get("metrics_addr"):
            return {int(str(params["metrics_addr"]).rsplit(":", 1)[1])}
        if "port" in params:
            return {int(params["port"])}
        return set()
    command = service.get("command") or []
    if "--port" in command:
        return {int(command[command.index("--port") + 1])}
    return {IMAGE_PORTS[_image(service)[0]]}


def test_compose_ports_bind_loopback_and_reach_a_listening_port() -> None:
    published = 0
    for name, service in SERVICES.items():
        for port in service.get("ports") or []:
            published += 1
            assert isinstance(port, str), f"{name}: write ports as HOST_IP:HOST:CONTAINER"
            host_ip, _, rest = port.partition(":")
            assert host_ip == "127.0.0.1", f"{name}: {port} is not bound to 127.0.0.1"
            container = int(rest.rsplit(":", 1)[1].split("/")[0])
            assert container in _listen_ports(name, service), (name, port)
    assert published >= 5


def test_compose_every_service_has_a_healthcheck_and_a_restart_policy() -> None:
    for name, service in SERVICES.items():
        check = service.get("healthcheck") or {}
        if _one_shot(service):
            assert check == {"disable": True}, name
            dependents = [s for s in SERVICES.values() if name in (s.get("depends_on") or {})]
            assert dependents, f"{name}: a one-shot nobody waits for"
            for other in dependents:
                assert other["depends_on"][name] == {"condition": "service_completed_successfully"}
            continue
        assert service.get("restart") == "unless-stopped", name
        test = check.get("test")
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
        assert {"interval", "timeout", "retries", "start_period"} <= set(check), name
        assert "curl" not in test, f"{name}: no curl in the slim and busybox images"
        for dep, cond in (service.get("depends_on") or {}).items():
            expected = "service_completed_successfully" if _one_shot(SERVICES[dep]) else (
                "service_healthy")  # fmt: skip
            assert cond == {"condition": expected}, (name, dep)


def test_compose_healthchecks_probe_the_port_the_service_listens_on() -> None:
    for name, service in SERVICES.items():
        test = " ".join((service.get("healthcheck") or {}).get("test") or [])
        probed = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", test)}
        if name == "postgres":
            assert test.startswith("CMD pg_isready"), test
        elif name == "planner":  # no HTTP endpoint: it checks it can reach the store
            assert "KVSCOPE_DB" in test and "connect()" in test, test
        elif not _one_shot(service):
            assert probed, f"{name}: its healthcheck probes no 127.0.0.1 port"
            assert probed <= _listen_ports(name, service), (name, probed)


# ----------------------------------------------------------------------- kvscope commands


def _defaults() -> dict[str, str]:
    """Each ${VAR:-default} at its default, each secret at a value (as compose substitutes)."""
    text = COMPOSE.read_text(encoding="utf-8")
    values = dict(re.findall(r"\$\{(\w+):-([^}]*)\}", text))
    return {**values, **_secret_values()}


def _substitute(token: str, values: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)(?::[-?][^}]*)?\}", lambda m: values[m.group(1)], token)


@functools.cache
def _root() -> Any:
    return typer.main.get_command(app)


def _kvscope_params(command: list[str], values: Mapping[str, str]) -> tuple[list[str], Any]:
    """(subcommand path, its parsed parameters): the command parsed by kvscope's own click
    command, as `kvscope` would parse it in the container (unknown flags, missing or badly
    typed values raise)."""
    tokens = [_substitute(str(t), values) for t in command]
    group = _root()
    path: list[str] = []
    cmd: Any = group
    while isinstance(cmd, TyperGroup) and tokens:
        sub = cmd.get_command(typer.Context(cmd), tokens[0])
        if sub is None:
            break
        path.append(tokens.pop(0))
        cmd = sub
    assert path and not isinstance(cmd, TyperGroup), f"not a kvscope command: {command}"
    ctx = cmd.make_context(" ".join(["kvscope", *path]), tokens)
    return path, ctx.params


@functools.cache
def _sim_endpoints() -> tuple[int, int]:
    """(engines, LMCache pools) of the scenario the sim service serves."""
    command = [_substitute(str(t), _defaults()) for t in SERVICES["sim"]["command"]]
    with scenario_file(command[1]) as path:
        scenario = parse_scenario(read_scenario_file(path), where=str(path), base_dir=path.parent)
    sim = Simulation(scenario)
    return len(sim.engines), len(sim.pools)


KVSCOPE_SERVICES = sorted(name for name, s in SERVICES.items() if _is_kvscope(s))


@pytest.mark.parametrize("name", KVSCOPE_SERVICES)
def test_compose_kvscope_command_parses_with_the_cli(name: str) -> None:
    path, params = _kvscope_params(SERVICES[name]["command"], _defaults())
    assert params, (name, path)
    env = SERVICES[name].get("environment") or {}
    if "db" in params:  # collect, plan, serve, db migrate read the store from KVSCOPE_DB
        assert params["db"] is None and "KVSCOPE_DB" in env, name
    if name in ("collector", "planner"):
        assert params["cluster"] == _defaults()["CLUSTER_NAME"]


def test_compose_kvscope_services_are_the_ones_expected() -> None:
    paths = {name: _kvscope_params(SERVICES[name]["command"], _defaults())[0][0]
             for name in KVSCOPE_SERVICES}  # fmt: skip
    assert paths == {"sim": "simulate", "migrate": "db", "collector": "collect",
                     "planner": "plan", "api": "serve"}  # fmt: skip
    _, collect = _kvscope_params(SERVICES["collector"]["command"], _defaults())
    assert collect["prometheus"] == "http://prometheus:9090"
    _, plan = _kvscope_params(SERVICES["planner"]["command"], _defaults())
    assert plan["every"]
    _, serve = _kvscope_params(SERVICES["api"]["command"], _defaults())
    assert serve["host"] == "0.0.0.0"


@pytest.mark.parametrize("name", KVSCOPE_SERVICES)
def test_compose_kvscope_command_flags_are_in_its_help(name: str) -> None:
    # in-process (the same click command `kvscope` runs; a subprocess per service would
    # cost ~1 s each): a wide terminal, so rich wraps no flag
    path, _ = _kvscope_params(SERVICES[name]["command"], _defaults())
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    words = set(re.findall(r"--[a-z][a-z0-9-]*", result.output))
    flags = {str(t).split("=")[0] for t in SERVICES[name]["command"] if str(t).startswith("--")}
    assert flags <= words, f"{name}: {sorted(flags - words)} not in --help"


def test_compose_sim_scenario_is_a_bundled_one() -> None:
    proc = run_kvscope("simulate", "--list")  # the real CLI, as the image's entry point runs
    assert proc.returncode == 0, proc.stderr
    bundled = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    command = SERVICES["sim"]["command"]
    assert command[0] == "simulate" and command[1] in bundled, (command[1], bundled)


# ----------------------------------------------------------------------- Prometheus


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path is not None, f"{name} is not installed: `make test` apt-installs it"
    return path


@pytest.mark.prometheus
def test_prometheus_config_passes_promtool_with_the_generated_rules() -> None:
    proc = subprocess.run(
        [_tool("promtool"), "check", "config", str(PROMETHEUS_YML)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "SUCCESS: 2 rule files found" in out, out


def test_prometheus_rule_files_resolve_to_the_mounted_generated_rules() -> None:
    config = _load(PROMETHEUS_YML)
    target = _bind_target("prometheus", "deploy/prometheus/prometheus.yml")
    assert f"--config.file={target}" in SERVICES["prometheus"]["command"]
    rules_target = _bind_target("prometheus", str(RULES_DIR))
    generated = {p for p in artifacts() if p.parent == RULES_DIR}
    assert generated, "dashboards.generate writes no rule file"
    seen = set()
    for rule_file in config["rule_files"]:
        # relative paths resolve against the config's directory, here and in the container
        assert not posixpath.isabs(rule_file), rule_file
        in_container = posixpath.normpath(posixpath.join(posixpath.dirname(target), rule_file))
        assert in_container.startswith(rules_target + "/"), (rule_file, rules_target)
        seen.add(RULES_DIR / posixpath.relpath(in_container, rules_target))
    assert seen == generated
    assert all((ROOT / p).is_file() for p in seen)


def _targets(job: Mapping[str, Any]) -> list[str]:
    return [t for sc in job.get("static_configs", []) for t in sc["targets"]]


def test_prometheus_scrapes_every_sim_endpoint_and_kvscope_under_the_rules_job_names() -> None:
    config = _load(PROMETHEUS_YML)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) >= SCRAPE_JOBS
    assert re.fullmatch(DEFAULT.lmcache_selector.split("=~")[1].strip('"'), "lmcache")
    assert DEFAULT.collector_selector == 'job="kvscope-collector"'
    assert DEFAULT.planner_selector == 'job="kvscope-api"'
    engines, pools = _sim_endpoints()
    base = min(_listen_ports("sim", SERVICES["sim"]))
    assert _targets(jobs["vllm"]) == [f"sim:{base + i}" for i in range(engines)]
    assert _targets(jobs["lmcache"]) == [f"sim:{base + engines + j}" for j in range(pools)]
    for job, service in (("kvscope-collector", "collector"), ("kvscope-api", "api")):
        ports = _listen_ports(service, SERVICES[service])
        assert _targets(jobs[job]) == [f"{service}:{p}" for p in sorted(ports)], job
    (am,) = [t for a in config["alerting"]["alertmanagers"] for t in _targets(a)]
    assert am == f"alertmanager:{IMAGE_PORTS['prom/alertmanager']}"
    interval = config["global"]["scrape_interval"]
    assert config["global"]["evaluation_interval"] == interval in ("10s", "15s")


# ----------------------------------------------------------------------- Alertmanager


@pytest.mark.prometheus
def test_alertmanager_config_passes_amtool() -> None:
    proc = subprocess.run(
        [_tool("amtool"), "check-config", str(ALERTMANAGER_YML)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_alertmanager_routes_everything_to_the_webhook_service() -> None:
    config = _load(ALERTMANAGER_YML)
    route = config["route"]
    assert not route.get("routes"), "one receiver: every alert reaches the webhook"
    (receiver,) = [r for r in config["receivers"] if r["name"] == route["receiver"]]
    (hook,) = receiver["webhook_configs"]
    assert hook["send_resolved"] is True
    host_port = hook["url"].split("/")[2]
    assert host_port == f"webhook:{next(iter(_listen_ports('webhook', SERVICES['webhook'])))}"
    assert _bind_target("alertmanager", "deploy/alertmanager/alertmanager.yml") in " ".join(
        SERVICES["alertmanager"]["command"]
    )
    webhook = SERVICES["webhook"]
    assert webhook["image"] == _dockerfile_base(), "one pinned Python for the stack"
    script = _bind_target("webhook", "deploy/alertmanager/webhook_logger.py")
    assert webhook["command"][:2] == ["python", script]


# ----------------------------------------------------------------------- Grafana


def test_grafana_provisioning_points_at_the_mounted_dashboards_and_prometheus() -> None:
    (provider,) = _load(GRAFANA / "dashboards" / "kvscope.yml")["providers"]
    assert provider["type"] == "file"
    mounted = _bind_target("grafana", "dashboards/generated")
    assert provider["options"]["path"] == mounted
    boards = sorted(p.name for p in artifacts() if p.suffix == ".json")
    assert len(boards) == 3
    assert sorted(p.name for p in (ROOT / "dashboards" / "generated").glob("*.json")) == boards
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert posixpath.dirname(home) == mounted and posixpath.basename(home) in boards
    for sub in ("dashboards", "datasources"):
        assert _bind_target("grafana", f"deploy/grafana/provisioning/{sub}") == (
            f"/etc/grafana/provisioning/{sub}"
        )

    (source,) = _load(GRAFANA / "datasources" / "prometheus.yml")["datasources"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", source["uid"]), "a fixed uid, no variable"
    assert source["url"] == f"http://prometheus:{IMAGE_PORTS['prom/prometheus']}"
    scrape = _load(PROMETHEUS_YML)["global"]["scrape_interval"]
    assert source["jsonData"]["timeInterval"] == scrape, "$__rate_interval needs the scrape"
    for name in boards:  # each board's `datasource` variable defaults to this source
        doc = json.loads((ROOT / "dashboards" / "generated" / name).read_text(encoding="utf-8"))
        (var,) = [v for v in doc["templating"]["list"] if v["type"] == "datasource"]
        assert var["query"] == source["type"]
        assert var["current"] == {"text": source["name"], "value": source["uid"]}, name


# ----------------------------------------------------------------------- Dockerfile


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions (continuations joined): (INSTRUCTION, its arguments)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    lines = [line.strip() for line in text.splitlines()]
    pairs = [line.split(None, 1) for line in lines if line and line[0] != "#"]
    return [(p[0].upper(), p[1] if len(p) > 1 else "") for p in pairs]


def _dockerfile_base() -> str:
    froms = [args.split()[0] for op, args in _dockerfile() if op == "FROM"]
    assert len(set(froms)) == 1, froms
    return froms[0]


def test_dockerfile_is_pinned_non_root_and_runs_kvscope() -> None:
    instructions = _dockerfile()
    assert image_is_pinned(_dockerfile_base())
    users = [args for op, args in instructions if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    (entry,) = [args for op, args in instructions if op == "ENTRYPOINT"]
    assert json.loads(entry) == ["kvscope"]  # exec form: signals reach kvscope (PID 1)


def test_dockerfile_copies_everything_the_wheel_is_built_from() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = set()
    for op, args in _dockerfile():
        words = shlex.split(args)
        if op == "COPY" and not any(w.startswith("--from") for w in words):
            for source in words[:-1]:
                assert (ROOT / source).exists(), source
                copied.add(source.strip("./"))
    assert packages | {"pyproject.toml", project["project"]["readme"]} <= copied
    ignored = {
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "out", ".env", "**/__pycache__"} <= ignored
    assert not copied & ignored


# ----------------------------------------------------------------------- the webhook logger


def _notification() -> dict[str, Any]:
    """A notification as Alertmanager 0.25+ posts it (webhook payload version 4)."""
    alert = ALERTS[0].name
    receiver = _load(ALERTMANAGER_YML)["route"]["receiver"]
    labels = {"alertname": alert, "instance": "sim:9100", "job": "vllm", "severity": "warning"}
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{alert}"}}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": receiver,
        "groupLabels": {"alertname": alert},
        "commonLabels": labels,
        "commonAnnotations": {"summary": "a summary", "runbook_url": "docs/runbooks.md"},
        "externalURL": "http://alertmanager:9093",
        "alerts": [
            {
                "status": "firing",
                "labels": labels,
                "annotations": {"summary": "a summary", "description": "what happened"},
                "startsAt": "2026-01-01T00:00:00.000Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus:9090/graph?g0.expr=up",
                "fingerprint": "0123456789abcdef",
            }
        ],
    }


MAX_BYTES = 200_000
# (case, body, status, error fragment); each is posted to /alerts/<case>
MALFORMED = [
    ("not-json", b"this is not json", 400, "not JSON"),
    ("empty", b"", 400, "not JSON"),
    ("not-utf8", b'{"alerts": [\xff]}', 400, "not UTF-8"),
    ("a-list", b"[1, 2]", 400, "a JSON list"),
    ("no-alerts", b'{"status": "firing"}', 400, "no `alerts` list"),
    ("alerts-not-objects", b'{"alerts": [1]}', 400, "no `alerts` list"),
    ("nested", b"[" * 100_000, 400, "not JSON"),
    ("too-large", b"{" + b" " * MAX_BYTES + b"}", 413, "exceeds"),
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class WebhookRun:
    statuses: dict[str, int]
    events: list[dict[str, Any]]
    out: Path
    returncode: int
    stderr: str


def _post(url: str, body: bytes) -> int:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def _post_unframed(host: str, port: int) -> int:
    """A POST without Content-Length (chunked): the logger cannot frame it."""
    conn = HTTPConnection(host, port, timeout=10)
    try:
        conn.putrequest("POST", "/alerts/unframed")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        conn.send(b"5\r\nhello\r\n0\r\n\r\n")
        return conn.getresponse().status
    finally:
        conn.close()


def _wait_ready(url: str, alive: Callable[[], bool]) -> None:
    for _ in range(200):
        assert alive(), "webhook_logger exited"
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            threading.Event().wait(0.05)
    raise AssertionError(f"{url} not ready")


@pytest.fixture(scope="module")
def webhook_run(tmp_path_factory: pytest.TempPathFactory) -> WebhookRun:
    """The script run as the compose service runs it, fed every malformed body, then a real
    notification (it must still answer), then stopped with SIGTERM."""
    out = tmp_path_factory.mktemp("webhook") / "sub" / "alerts.jsonl"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(WEBHOOK), "--host", "127.0.0.1", "--port", str(port),
         "--out", str(out), "--max-bytes", str(MAX_BYTES)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    statuses: dict[str, int] = {}
    try:
        _wait_ready(f"{base}/healthz", lambda: proc.poll() is None)
        for case, body, _, _ in MALFORMED:
            statuses[case] = _post(f"{base}/alerts/{case}", body)
        statuses["unframed"] = _post_unframed("127.0.0.1", port)
        statuses["notification"] = _post(
            f"{base}/alerts", json.dumps(_notification()).encode("utf-8")
        )
        try:
            urllib.request.urlopen(f"{base}/elsewhere", timeout=5).close()
        except urllib.error.HTTPError as exc:
            exc.close()
            statuses["get-elsewhere"] = exc.code
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    events = [json.loads(line) for line in stdout.splitlines()]
    return WebhookRun(statuses, events, out, proc.returncode, stderr)


@pytest.mark.parametrize(("case", "status", "error"), [(c, s, e) for c, _, s, e in MALFORMED])
def test_webhook_logger_malformed_body_is_rejected_and_logged(
    webhook_run: WebhookRun, case: str, status: int, error: str
) -> None:
    assert webhook_run.statuses[case] == status
    (event,) = [e for e in webhook_run.events if e.get("path") == f"/alerts/{case}"]
    assert event["event"] == "rejected" and event["status_code"] == status
    assert error in event["error"], event


def test_webhook_logger_body_without_content_length_is_411(webhook_run: WebhookRun) -> None:
    assert webhook_run.statuses["unframed"] == 411
    (event,) = [e for e in webhook_run.events if e.get("path") == "/alerts/unframed"]
    assert event["status_code"] == 411


def test_webhook_logger_notification_is_one_json_line_and_appended_to_out(
    webhook_run: WebhookRun,
) -> None:
    sent = _notification()
    assert webhook_run.statuses["notification"] == 200  # after every malformed one
    (event,) = [e for e in webhook_run.events if e["event"] == "notification"]
    assert event["notification"] == sent
    assert event["path"] == "/alerts" and event["status"] == "firing"
    assert event["n_alerts"] == 1 and event["alertnames"] == [ALERTS[0].name]
    assert event["receiver"] == sent["receiver"]
    lines = webhook_run.out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [sent]  # the body as sent, nothing else


def test_webhook_logger_sigterm_stops_cleanly_after_logging_every_request(
    webhook_run: WebhookRun,
) -> None:
    assert webhook_run.returncode == 0, webhook_run.stderr
    assert webhook_run.stderr == ""  # nothing but JSON lines, on stdout
    kinds = [e["event"] for e in webhook_run.events]
    assert kinds[0] == "listening" and kinds[-1] == "stopped"
    assert kinds.count("rejected") == len(MALFORMED) + 1
    assert webhook_run.statuses["get-elsewhere"] == 404


@contextmanager
def _imported_server(out: Path, stream: io.StringIO) -> Iterator[str]:
    """webhook_logger imported (not run) and serving in a thread on any free port."""
    spec = importlib.util.spec_from_file_location("webhook_logger", WEBHOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    server = module.make_server("127.0.0.1", 0, out=out, stream=stream)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield str(server.url)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_webhook_logger_imported_serves_in_a_thread_on_any_port(tmp_path: Path) -> None:
    stream = io.StringIO()
    with _imported_server(tmp_path / "a.jsonl", stream) as url:
        assert _post(f"{url}/alerts", json.dumps(_notification()).encode()) == 200
        assert _post(f"{url}/alerts", b"{") == 400
    events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert events == ["notification", "rejected"]
    assert len((tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()) == 1


def test_webhook_logger_unwritable_out_is_a_500_and_it_keeps_serving(tmp_path: Path) -> None:
    out, stream = tmp_path / "a.jsonl", io.StringIO()
    body = json.dumps(_notification()).encode()
    with _imported_server(out, stream) as url:
        out.unlink()
        out.mkdir()  # appending to a directory fails
        assert _post(f"{url}/alerts", body) == 500
        out.rmdir()
        assert _post(f"{url}/alerts", body) == 200
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["error", "notification"]
    assert "cannot append to --out" in events[0]["error"]
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == [
        _notification()
    ]
