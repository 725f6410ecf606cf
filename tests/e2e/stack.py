"""Helpers of the end-to-end test: child processes with their logs, stages with deadlines,
and the Prometheus / Alertmanager configuration it runs with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dashboards.generate import RULES_DIR

ROOT = Path(__file__).resolve().parents[2]
KVSCOPE = str(Path(sys.executable).with_name("kvscope"))
RULE_FILES = ("kvscope-records.yml", "kvscope-alerts.yml")
ALERTMANAGER_YML = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
WEBHOOK_LOGGER = ROOT / "deploy" / "alertmanager" / "webhook_logger.py"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Proc:
    """A child process whose stdout and stderr go to files (read back for failure messages)."""

    name: str
    popen: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def tail(self, chars: int = 1500) -> str:
        err = self.stderr.read_text(errors="replace")[-chars:]
        return f"--- {self.name} (exit {self.popen.poll()}) stderr tail:\n{err}"

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then the exit code (SIGKILL and a failure if it does not stop in time)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(
                f"{self.name} did not stop within {timeout_s:g} s of SIGTERM\n{self.tail()}"
            ) from None


@contextmanager
def started(name: str, args: Sequence[str], tmp: Path) -> Iterator[Proc]:
    """``args`` running with no ``KVSCOPE_*`` settings from the environment; stopped (killed
    if SIGTERM is not enough) when the block ends, also on failure."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    with out.open("wb") as fo, err.open("wb") as fe:
        popen = subprocess.Popen(list(args), stdout=fo, stderr=fe, env=env)
    proc = Proc(name, popen, out, err)
    try:
        yield proc
    finally:
        if popen.poll() is None:
            popen.terminate()
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()


@dataclass(slots=True)
class Stages:
    """Wall time of each stage since the test began; a stage that does not happen in time
    fails naming itself, with what was last seen and the processes' stderr tails."""

    began: float = field(default_factory=time.monotonic)
    done: dict[str, float] = field(default_factory=dict)

    def mark(self, stage: str) -> None:
        self.done[stage] = round(time.monotonic() - self.began, 2)

    def until(
        self,
        stage: str,
        probe: Callable[[], T | None],
        *,
        timeout_s: float,
        procs: Sequence[Proc] = (),
        seen: Callable[[], object] | None = None,
        every_s: float = 0.5,
    ) -> T:
        """Poll ``probe`` until it returns something other than None (or a child exits)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = probe()
            if got is not None:
                self.mark(stage)
                return got
            dead = [p for p in procs if p.popen.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{dead[0].name} exited" if dead else f"not within {timeout_s:g} s"
                last = f"\nlast seen: {seen()!r}"[:3000] if seen is not None else ""
                tails = "\n".join(p.tail() for p in procs)
                raise AssertionError(
                    f"stage '{stage}' did not happen ({why}); stages done (s since start): "
                    f"{self.done}{last}\n{tails}"
                )
            time.sleep(every_s)


def get_json(url: str, timeout_s: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.load(resp)


def try_json(url: str) -> Any:
    """The JSON at ``url``, or None while the server is not answering yet."""
    try:
        return get_json(url, timeout_s=2.0)
    except OSError:
        return None


def shortened_rules(dest: Path, for_: str) -> tuple[list[Path], dict[str, str]]:
    """The committed rule files copied into ``dest`` with every alert's ``for:`` set to
    ``for_`` (parsed and re-dumped: nothing else is touched); the paths and the original
    ``for:`` of each alert."""
    paths, original = [], {}
    for name in RULE_FILES:
        doc = yaml.safe_load((ROOT / RULES_DIR / name).read_text(encoding="utf-8"))
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    original[rule["alert"]] = str(rule.get("for", "0s"))
                    rule["for"] = for_
        path = dest / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        paths.append(path)
    return paths, original


def rule_exprs(paths: Sequence[Path]) -> dict[str, str]:
    """record/alert name -> expression of every rule in ``paths``."""
    out = {}
    for path in paths:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                out[rule.get("record") or rule["alert"]] = rule["expr"]
    return out


def prometheus_config(jobs: dict[str, list[str]], rules: Sequence[Path], alertmanager: str) -> str:
    """Scrape and evaluate every second; send alerts to ``alertmanager`` (host:port)."""
    doc = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms",
                   "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rules],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": targets}]}
            for job, targets in jobs.items()
        ],
    }  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False)


def alertmanager_config(webhook_url: str) -> str:
    """The committed deploy/alertmanager/alertmanager.yml with every webhook pointed at
    ``webhook_url`` and the root route notifying after 1 s instead of its production
    group_wait / group_interval (parsed and re-dumped: routing and receivers unchanged)."""
    doc = yaml.safe_load(ALERTMANAGER_YML.read_text(encoding="utf-8"))
    doc["route"] |= {"group_wait": "1s", "group_interval": "1s"}
    hooks = [h for r in doc["receivers"] for h in r.get("webhook_configs", [])]
    assert hooks, f"{ALERTMANAGER_YML} has no webhook receiver"
    for hook in hooks:
        hook["url"] = webhook_url
    return yaml.safe_dump(doc, sort_keys=False)


def listening_url(proc: Proc) -> str | None:
    """The URL webhook_logger.py announced on stdout (``{"event": "listening", …}``)."""
    for line in proc.stdout.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "listening":
            return str(event["url"])
    return None


def notifications(out: Path) -> list[dict[str, Any]]:
    """Every notification webhook_logger.py appended to its --out file so far (a partly
    written last line is left for the next read)."""
    docs = []
    for line in out.read_text(encoding="utf-8").splitlines() if out.exists() else []:
        try:
            docs.append(json.loads(line))
        except ValueError:
            continue
    return docs


def hostport(url: str) -> str:
    return url.split("//", 1)[1].split("/", 1)[0]
