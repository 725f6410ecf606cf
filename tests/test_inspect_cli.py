"""`kvscope inspect`: a fixture file and a real HTTP server on 127.0.0.1, via the real CLI."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from collector.parse import read_exposition
from kvscope.commands.inspect import snapshot_json

METRICS = Path(__file__).resolve().parent / "fixtures" / "metrics"
FULL = METRICS / "vllm-0.33.0-metrics-full.txt"


def kvscope(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvscope.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def strict_json(text: str) -> Any:
    def no_constants(name: str) -> Any:
        raise AssertionError(f"non-JSON constant {name}")

    return json.loads(text, parse_constant=no_constants)


def entry(doc: dict[str, Any], signal: str, **labels: str) -> Any:
    got = [e["value"] for e in doc["series"] if e["signal"] == signal and e["labels"] == labels]
    assert len(got) == 1, (signal, labels, got)
    return got[0]


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("www")
    (root / "metrics").write_bytes(FULL.read_bytes())
    (root / "broken").write_text('vllm:num_preemptions_total{engine="0"} 1\nfoo{a="b} 2\n')
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_inspect_json_fixture_file_shape_and_values() -> None:
    proc = kvscope("inspect", str(FULL), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert set(doc) == {"series", "unknown_families", "facts", "warnings", "warning_counts"}
    assert (doc["warnings"], doc["warning_counts"]) == ([], {})
    assert proc.stderr == ""
    assert all(set(e) == {"signal", "labels", "value"} for e in doc["series"])
    engine0 = {"engine": "0", "model_name": "tiny-llama"}
    assert entry(doc, "preemptions_total", **engine0) == 3.0
    assert entry(doc, "kv_cache_usage_ratio", engine="1", model_name="tiny-llama") == 0.42
    assert entry(doc, "ttft_seconds_count", **engine0) == 3.0
    assert entry(doc, "ttft_seconds_sum", **engine0) == 0.135
    assert entry(doc, "offload_bytes_total", direction="store", **engine0) == 12288.0
    assert not any(e["signal"] == "ttft_seconds" for e in doc["series"])
    # 108 canonical series; 38 are histograms (count + sum each): 13 request histograms and
    # 3 kv_block_* per engine, offload size per engine and direction, LMCache MP lookup
    assert len(doc["series"]) == 108 + (13 + 3) * 2 + 2 * 2 + 2
    assert "python_info" in doc["unknown_families"]
    assert [f["engine"] for f in doc["facts"]["cache_config"]] == ["0", "1"]
    assert doc["facts"]["cache_config"][0]["num_gpu_blocks"] == "1024"


def test_inspect_json_http_url_matches_file(http_root: str) -> None:
    from_url = kvscope("inspect", f"{http_root}/metrics", "--json")
    from_file = kvscope("inspect", str(FULL), "--json")
    assert from_url.returncode == 0, from_url.stderr
    assert strict_json(from_url.stdout) == strict_json(from_file.stdout)


def test_inspect_table_lists_signals_unknowns_and_facts() -> None:
    proc = kvscope("inspect", str(METRICS / "production-stack-router-metrics.txt"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.splitlines()[0].split() == ["SIGNAL", "LABELS", "VALUE"]
    running = [line for line in out.splitlines() if line.startswith("router_requests_running ")]
    assert len(running) == 1 and running[0].split()[-1] == "4.0"
    assert "requests_running " not in out.replace("router_requests_running ", "")
    assert "25 unknown families" in out


def test_inspect_malformed_file_exits_2_naming_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text('# HELP x\nvllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:x{a="1\\q"} 1\n')
    proc = kvscope("inspect", str(bad), "--json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert f"{bad}:3: bad escape" in proc.stderr


def test_inspect_malformed_url_exits_2_naming_line(http_root: str) -> None:
    proc = kvscope("inspect", f"{http_root}/broken")
    assert proc.returncode == 2
    assert f"{http_root}/broken:2: unterminated label value of 'a'" in proc.stderr


def test_inspect_http_404_exits_2(http_root: str) -> None:
    proc = kvscope("inspect", f"{http_root}/nope", "--json")
    assert proc.returncode == 2
    assert "http_status: HTTP 404" in proc.stderr


def test_inspect_body_over_size_cap_exits_2(http_root: str) -> None:
    proc = kvscope("inspect", f"{http_root}/metrics", env={"KVSCOPE_MAX_BODY_BYTES": "4096"})
    assert proc.returncode == 2
    assert "too_large" in proc.stderr


def test_inspect_missing_file_exits_2(tmp_path: Path) -> None:
    proc = kvscope("inspect", str(tmp_path / "absent.txt"))
    assert proc.returncode == 2
    assert "absent.txt" in proc.stderr


def test_inspect_non_finite_values_valid_json(tmp_path: Path) -> None:
    path = tmp_path / "nan.txt"
    path.write_text(
        'vllm:kv_cache_usage_perc{engine="0"} NaN\n'
        'vllm:num_requests_running{engine="0"} +Inf\n'
        'vllm:num_requests_waiting{engine="0"} -Inf\n'
    )
    proc = kvscope("inspect", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert entry(doc, "kv_cache_usage_ratio", engine="0") == "NaN"
    assert entry(doc, "requests_running", engine="0") == "+Inf"
    assert entry(doc, "requests_waiting", engine="0") == "-Inf"


def test_inspect_help_has_example() -> None:
    proc = kvscope("inspect", "--help")
    assert proc.returncode == 0
    assert "kvscope inspect http" in proc.stdout


LINE_489 = 'vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 3.0'


def _anomalous(tmp_path: Path) -> Path:
    """The full fixture with a NaN counter (line 489) and a repeated series at the end."""
    lines = FULL.read_text().split("\n")
    assert lines[488] == LINE_489
    lines[488] = LINE_489.replace(" 3.0", " NaN")
    lines.insert(-1, LINE_489.replace('engine="0"', 'engine="1"').replace(" 3.0", " 42.0"))
    path = tmp_path / "anomalous.txt"
    path.write_text("\n".join(lines))
    return path


def test_inspect_json_value_anomalies_are_warnings_exit_0(tmp_path: Path) -> None:
    proc = kvscope("inspect", str(_anomalous(tmp_path)), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    clean = snapshot_json(read_exposition(FULL.read_text(), str(FULL), 0.0))  # as the CLI
    engine1 = {"engine": "1", "model_name": "tiny-llama"}
    assert doc["warnings"] == [
        {"kind": "nan", "name": "vllm:num_preemptions_total", "labels": {"engine": "0",
         "model_name": "tiny-llama"}, "line": 489, "dropped": True,
         "detail": "counter value nan dropped"},
        {"kind": "duplicate_series", "name": "vllm:num_preemptions_total", "labels": engine1,
         "line": FULL.read_text().count("\n") + 1, "dropped": True,
         "detail": "the first value 3.0 stands"},
    ]  # fmt: skip
    assert doc["warning_counts"] == {"duplicate_series": 1, "nan": 1}
    lost = [e for e in clean["series"] if e["signal"] == "preemptions_total"
            and e["labels"]["engine"] == "0"]  # fmt: skip
    assert len(lost) == 1 and doc["series"] == [e for e in clean["series"] if e not in lost]
    assert entry(doc, "preemptions_total", **engine1) == 3.0  # the first of the two stands
    assert "warning: " in proc.stderr and "2 warnings (duplicate_series 1, nan 1)" in proc.stderr


def test_inspect_table_lists_warnings_with_line_kind_and_labels(tmp_path: Path) -> None:
    proc = kvscope("inspect", str(_anomalous(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    head = out.index("2 warnings (duplicate_series 1, nan 1): value anomalies, the rest of the "
                     "exposition is read")  # fmt: skip
    assert out[head + 1] == (
        '  line 489: nan vllm:num_preemptions_total{engine="0",model_name="tiny-llama"}: '
        "dropped: counter value nan dropped"
    )
    assert out[head + 2].startswith("  line ") and " duplicate_series " in out[head + 2]


def test_inspect_body_cut_short_exits_2_truncated() -> None:
    body = FULL.read_bytes()
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    with socket.create_server(("127.0.0.1", 0)) as srv:

        def answer() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(head + body[: len(body) // 2])  # then close: cut short

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        proc = kvscope("inspect", f"http://127.0.0.1:{srv.getsockname()[1]}/metrics")
        thread.join(timeout=10)
    assert proc.returncode == 2
    assert f"truncated: body cut short after {len(body) // 2} bytes" in proc.stderr


def _one_answer(response: bytes) -> tuple[Any, threading.Thread]:
    """A socket server on 127.0.0.1 that answers one request with ``response``."""
    srv = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(response)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return srv, thread


def test_inspect_redirect_to_another_origin_is_refused() -> None:
    srv, thread = _one_answer(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.2:9/metrics\r\n"
                              b"Content-Length: 0\r\n\r\n")  # fmt: skip
    with srv:
        proc = kvscope("inspect", f"http://127.0.0.1:{srv.getsockname()[1]}/metrics")
        thread.join(timeout=10)
    assert proc.returncode == 2
    assert "redirect: HTTP 302 to http://127.0.0.2:9/metrics refused" in proc.stderr


def test_inspect_inflated_body_over_the_cap_is_refused() -> None:
    body = gzip.compress(b"# padding\n" * 100_000)  # ~1 MB inflated from a few KB
    head = (f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(body)}"
            "\r\n\r\n").encode()  # fmt: skip
    srv, thread = _one_answer(head + body)
    with srv:
        proc = kvscope("inspect", f"http://127.0.0.1:{srv.getsockname()[1]}/metrics",
                       env={"KVSCOPE_MAX_BODY_BYTES": "65536"})  # fmt: skip
        thread.join(timeout=10)
    assert len(body) < 65536
    assert proc.returncode == 2
    assert "too_large: inflated body exceeds the 65536-byte cap" in proc.stderr
