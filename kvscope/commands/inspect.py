"""`kvscope inspect PATH_OR_URL [--json]`: what kvscope reads from one exposition.

``--json`` prints one object: ``series`` (one entry per signal and label set; a histogram's
``_count`` and ``_sum``), ``unknown_families``, ``facts``, ``warnings`` (the value anomalies,
read past) and ``warning_counts``; non-finite values as the strings "NaN", "+Inf", "-Inf". A
syntax error or a truncated body is ``kvscope: error: <source>:<line>: <reason>``, exit 2.

Output format: kvscope/DESIGN.md#inspect
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import typer

from collector.gcpolicy import tune_heap
from core.errors import ConfigError, ParseError, ScrapeError
from core.records import Snapshot


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ParseError(source, line, f"invalid UTF-8 at byte {exc.start}") from None


def _read_file(path: str, max_bytes: int) -> str:
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise ScrapeError(path, "too_large", f"{size} bytes > max_body_bytes={max_bytes}")
        data = p.read_bytes()
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise ConfigError(f"{path}: cannot read exposition: {exc.strerror}") from None
    return _decode(data, path)


def _read_url(url: str, timeout_s: float, max_bytes: int) -> str:
    """The body of one URL through the collector's own fetch (collector.scrape.fetch_body:
    its size cap counts inflated bytes, redirects stay on the URL's origin)."""
    # start-up: asyncio and the collector's HTTP client (~150 ms) only for a URL
    import asyncio

    from collector.scrape import ClientPool, FetchFailed, Target, fetch_body

    target = Target(name=url, url=url, kind="vllm")

    async def get() -> bytes:
        async with ClientPool() as pool:
            conn = pool.client(target)
            async with asyncio.timeout(timeout_s):
                return await fetch_body(conn, target, max_body_bytes=max_bytes)

    try:
        data = asyncio.run(get())
    except FetchFailed as exc:
        raise ScrapeError(url, exc.kind, exc.message) from exc
    except TimeoutError as exc:
        raise ScrapeError(url, "timeout", f"no complete answer in {timeout_s:g} s") from exc
    return _decode(data, url)


def read_source(source: str, timeout_s: float, max_bytes: int) -> str:
    """The exposition text of a file path or an http(s) URL."""
    if source.startswith(("http://", "https://")):
        return _read_url(source, timeout_s, max_bytes)
    return _read_file(source, max_bytes)


def _num(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """The --json document for one snapshot (kvscope/DESIGN.md#inspect)."""
    series: list[dict[str, Any]] = []
    for s in sorted(snap.samples, key=lambda s: (s.signal, s.labels)):
        labels = dict(s.labels)
        if s.kind == "histogram":
            series.append({"signal": f"{s.signal}_count", "labels": labels, "value": _num(s.value)})
            series.append({"signal": f"{s.signal}_sum", "labels": labels, "value": _num(s.sum)})
        else:
            series.append({"signal": s.signal, "labels": labels, "value": _num(s.value)})
    facts = {k: [dict(v) for v in vs] for k, vs in sorted(snap.facts.items())}
    warnings = [
        {"kind": a.kind, "name": a.name, "labels": dict(a.labels), "line": a.line,
         "dropped": a.dropped, "detail": a.detail}
        for a in snap.anomalies
    ]  # fmt: skip
    counts = dict(sorted(Counter(a.kind for a in snap.anomalies).items()))
    return {"series": series, "unknown_families": list(snap.unknown_families), "facts": facts,
            "warnings": warnings, "warning_counts": counts}  # fmt: skip


def warning_summary(doc: dict[str, Any]) -> str:
    """``3 warnings (duplicate_series 1, nan 2)``, or ``no warnings``."""
    counts: dict[str, int] = doc["warning_counts"]
    total = sum(counts.values())
    if not total:
        return "no warnings"
    kinds = ", ".join(f"{k} {n}" for k, n in counts.items())
    return f"{total} warning{'s' if total != 1 else ''} ({kinds})"


def _fmt_labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


def render_table(doc: dict[str, Any]) -> str:
    """A readable table of the --json document."""
    rows = [(e["signal"], _fmt_labels(e["labels"]), str(e["value"])) for e in doc["series"]]
    w0 = max([len("SIGNAL"), *(len(r[0]) for r in rows)])
    w1 = max([len("LABELS"), *(len(r[1]) for r in rows)])
    out = [f"{'SIGNAL':<{w0}}  {'LABELS':<{w1}}  VALUE"]
    out += [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    unknown = doc["unknown_families"]
    out.append("")
    out.append(f"{len(rows)} series; {len(unknown)} unknown families (not signals)")
    if unknown:
        out.append("  " + ", ".join(unknown))
    for key, entries in doc["facts"].items():
        out.append(f"fact {key}: {len(entries)} series")
        for labels in entries:
            out.append("  " + _fmt_labels(labels))
    if doc["warnings"]:
        out.append("")
        out.append(f"{warning_summary(doc)}: value anomalies, the rest of the exposition is read")
        for w in doc["warnings"]:
            fate = "dropped" if w["dropped"] else "kept"
            where = f"{w['name']}{_fmt_labels(w['labels'])}"
            out.append(f"  line {w['line']}: {w['kind']} {where}: {fate}: {w['detail']}")
    return "\n".join(out)


def inspect_cmd(
    source: str = typer.Argument(..., help="exposition file or http(s):// /metrics URL"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
) -> None:
    """Show the canonical signals kvscope reads from one /metrics exposition.

    Example: kvscope inspect http://10.0.0.5:8000/metrics --json
    """
    # start-up: the parser and the settings (pydantic, ~140 ms) only when the command runs
    from collector.parse import read_exposition
    from kvscope.cli_settings import get_settings

    settings = get_settings()
    text = read_source(source, settings.scrape_timeout_s, settings.max_body_bytes)
    tune_heap()  # a big exposition's labels and samples live until the read ends
    doc = snapshot_json(read_exposition(text, source, time.time()))
    if as_json:
        typer.echo(json.dumps(doc, allow_nan=False))
    else:
        typer.echo(render_table(doc))
    if doc["warnings"]:  # warnings, not errors: the exit status stays 0
        typer.echo(f"kvscope: warning: {source}: {warning_summary(doc)}", err=True)


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect_cmd)
