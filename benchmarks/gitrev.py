"""A git revision's packages in a temporary directory, for benchmarks that time this tree's
code against an earlier revision's in the same run (bench_sim --against, bench_plan
--pg-baseline, bench_fit --baseline-rev)."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def revision_tree(rev: str, packages: Sequence[str], *, who: str) -> Iterator[Path]:
    """The top-level ``packages`` of revision ``rev`` (git archive), extracted into a temporary
    directory removed on exit; SystemExit naming ``who`` and the revision when git refuses.

    A package the revision does not have (one added later, e.g. ``core`` or ``store``) is left
    out; SystemExit when it has none of them."""
    present = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "--", *packages],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if present.returncode != 0:
        raise SystemExit(f"{who}: revision {rev}: {present.stderr.strip()}")
    have = set(present.stdout.split())
    packages = [p for p in packages if p in have]
    if not packages:
        raise SystemExit(f"{who}: revision {rev} has none of the packages it needs")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, *packages],
        capture_output=True, check=False,
    )  # fmt: skip
    if archive.returncode != 0:
        raise SystemExit(f"{who}: revision {rev}: {archive.stderr.decode().strip()}")
    with tempfile.TemporaryDirectory(prefix="kvscope-rev-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)
