"""The generated Kubernetes objects (dashboards.kubernetes) hold exactly the generated rules and
dashboards: the PrometheusRule's groups are the rule files' groups and pass `promtool check
rules`; each dashboard ConfigMap carries its dashboards/generated JSON byte for byte, labelled
and annotated for Grafana's sidecar."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards.generate import DASHBOARD_DIR, RULES_DIR
from dashboards.kubernetes import DASHBOARD_LABEL, FOLDER, FOLDER_ANNOTATION
from tests.kubernetes.render import OVERLAYS, ROOT, Obj, render


def _rule(overlay: str) -> Obj:
    (rule,) = [o for o in render(f"overlays/{overlay}") if o["kind"] == "PrometheusRule"]
    return rule


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_rule_holds_exactly_the_generated_rule_files(overlay: str) -> None:
    files = [yaml.safe_load((ROOT / RULES_DIR / f).read_text())
             for f in ("kvscope-records.yml", "kvscope-alerts.yml")]  # fmt: skip
    assert _rule(overlay)["spec"]["groups"] == [g for doc in files for g in doc["groups"]]


@pytest.mark.prometheus
def test_prometheus_rule_passes_promtool_check_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (`make apt-deps` installs Debian's prometheus)")
    path = tmp_path / "kvscope-rules.yml"
    path.write_text(yaml.safe_dump({"groups": _rule(OVERLAYS[0])["spec"]["groups"]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr
    # and it can fail: a broken expression is refused
    broken = yaml.safe_load(path.read_text())
    broken["groups"][0]["rules"][0]["expr"] = "sum(rate(x[5m])"
    path.write_text(yaml.safe_dump(broken))
    proc = subprocess.run([promtool, "check", "rules", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode != 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_dashboard_configmaps_carry_the_generated_dashboards(overlay: str) -> None:
    maps = [o for o in render(f"overlays/{overlay}")
            if o["kind"] == "ConfigMap" and DASHBOARD_LABEL.items() <= o["metadata"].get(
                "labels", {}).items()]  # fmt: skip
    got = {key: text for m in maps for key, text in m["data"].items()}
    want = {p.name: p.read_text() for p in sorted((ROOT / DASHBOARD_DIR).glob("*.json"))}
    assert got == want
    for m in maps:
        assert m["metadata"]["annotations"] == {FOLDER_ANNOTATION: FOLDER}
        assert len(m["data"]) == 1
        # kubectl apply (client side) keeps the object in an annotation of at most 256 KiB
        assert len(yaml.safe_dump(m)) < 256 * 1024 - 4096, m["metadata"]["name"]
