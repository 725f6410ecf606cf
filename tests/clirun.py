"""Running the real ``kvscope`` CLI in a subprocess, as an operator would."""

from __future__ import annotations

import os
import subprocess
import sys


def run_kvscope(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m kvscope.cli ARGS`` with no ``KVSCOPE_*`` settings from the environment but
    those of ``env``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "kvscope.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], message: str) -> None:
    """Exit 2, ``message`` on stderr without a traceback, nothing on stdout."""
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
