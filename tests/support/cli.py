"""The `txbroker` command as a test runs it: a subprocess of this virtualenv's entry point."""

from __future__ import annotations

import os
import subprocess

from support.brokers import TXBROKER


def run_cli(*args: str, check: bool = True, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`env`: variables set for this run, over the test's own environment."""
    r = subprocess.run([TXBROKER, *args], capture_output=True, text=True, timeout=60, input=input,
                       env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    if check and r.returncode != 0:
        raise AssertionError(f"txbroker {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r
