"""The CLI composition root: help works and lists the commands."""

from __future__ import annotations

import subprocess
import sys


def test_cli_help_no_args_exits_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "kvscope" in proc.stdout.lower()
