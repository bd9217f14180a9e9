"""The `txbroker` command as a test runs it: a subprocess of this virtualenv's entry point."""

from __future__ import annotations

import os
import subprocess

from support.brokers import TXBROKER


def run_cli(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([TXBROKER, *args], capture_output=True, text=True, timeout=60, input=input,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if check and r.returncode != 0:
        raise AssertionError(f"txbroker {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r
