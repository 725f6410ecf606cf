"""What the accuracy studies (verdict_study.py, tier_study.py) share to run their cases: a
resumable run that appends each case's result to ``<out>.partial.jsonl`` as it finishes (on
``jobs`` forked workers), and the git revision the results were made at."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing import get_context
from pathlib import Path
from typing import Any


def git_revision() -> str:
    """The short commit of this checkout, "+dirty" when tracked files differ from it, or "?".
    Read it before a run starts: a commit made while it runs is not the code it ran."""
    here = Path(__file__).parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
            cwd=here,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
            text=True, check=True, cwd=here,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return f"{rev}+dirty" if dirty else rev


def run_cases(
    names: Sequence[str],
    items: Sequence[Any],
    worker: Callable[[Any], dict[str, Any]],
    *,
    out: Path,
    jobs: int,
    resume: bool,
    label: str,
) -> tuple[list[dict[str, Any]], float]:
    """``worker(item)`` for each case (``names[i]`` is ``items[i]``'s case), each result (a
    dict with "case", and "error" when it failed) appended to ``out``'s partial file as it
    comes. With ``resume`` the cases the partial file holds without an error are kept and not
    run again; otherwise the file starts afresh. Returns every result in ``names`` order and
    the wall seconds (the resumed cases' ``wall_s`` over ``jobs`` included)."""
    partial = out.with_suffix(".partial.jsonl")
    done: dict[str, dict[str, Any]] = {}
    if resume and partial.exists():
        for line in partial.read_text().splitlines():
            r = json.loads(line)
            if "error" not in r:
                done[r["case"]] = r
    elif partial.exists():
        partial.unlink()
    run = [item for name, item in zip(names, items, strict=True) if name not in done]
    print(f"{label}: {len(names)} cases ({len(done)} done), {jobs} worker(s)",
          file=sys.stderr, flush=True)  # fmt: skip
    t0 = time.perf_counter()
    partial.parent.mkdir(parents=True, exist_ok=True)
    results = list(done.values())
    with partial.open("a") as fh:

        def keep(r: dict[str, Any]) -> None:
            fh.write(json.dumps(r) + "\n")
            fh.flush()
            results.append(r)

        if jobs > 1:
            with get_context("fork").Pool(jobs) as pool:
                for r in pool.imap_unordered(worker, run):
                    keep(r)
        else:
            for item in run:
                keep(worker(item))
    order = {name: i for i, name in enumerate(names)}
    results.sort(key=lambda r: order.get(r["case"], 1 << 30))
    resumed_s = sum(r.get("wall_s", 0.0) for r in done.values()) / max(jobs, 1)
    return results, time.perf_counter() - t0 + resumed_s
