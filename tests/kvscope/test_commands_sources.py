"""`kvscope sources [ID] [--json]`: the registry on stdout, an unknown id exits 2."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvscope.cli import app
from planner.domain.citations import get_citation, registry
from tests.clirun import assert_one_line_error, run_kvscope

RUNNER = CliRunner()


def test_sources_json_lists_every_registered_source() -> None:
    result = RUNNER.invoke(app, ["sources", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)["sources"]
    assert [s["id"] for s in listed] == list(registry())
    assert all(s["url"].startswith("https://") and s["figures"] for s in listed)


def test_sources_id_json_prints_that_source() -> None:
    result = RUNNER.invoke(app, ["sources", "gke-tiered-kv-2025", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    gke = get_citation("gke-tiered-kv-2025")
    assert payload["id"] == gke.id and payload["url"] == gke.url
    assert {"what", "value", "hardware"} <= set(payload["figures"][0])


def test_sources_id_text_shows_url_and_hardware() -> None:
    result = RUNNER.invoke(app, ["sources", "vllm-offloading-connector-2026"])
    assert result.exit_code == 0, result.output
    assert get_citation("vllm-offloading-connector-2026").url in result.stdout
    assert "hardware: H100" in result.stdout


def test_sources_text_lists_every_id() -> None:
    result = RUNNER.invoke(app, ["sources"])
    assert result.exit_code == 0, result.output
    assert all(sid in result.stdout for sid in registry())


def test_sources_unknown_id_exits_2_with_one_line_error() -> None:
    proc = run_kvscope("sources", "no-such-source", "--json")
    assert_one_line_error(proc, "unknown source 'no-such-source'; known: ")
    assert "gke-tiered-kv-2025" in proc.stderr


def test_sources_help_has_an_example() -> None:
    result = RUNNER.invoke(app, ["sources", "--help"])
    assert result.exit_code == 0 and "Example: kvscope sources" in result.stdout
