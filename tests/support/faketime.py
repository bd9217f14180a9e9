"""A real broker whose wall clock libfaketime moves (as chaos/broker.py does; `chaos/setup.sh`, run
by `make test`, installs it): the offset written to its `clock` file, read again every second."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from support.brokers import BrokerProcess

FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

needs_faketime = pytest.mark.skipif(not Path(FAKETIME).exists(),
                                    reason="libfaketime missing (chaos/setup.sh installs it)")


@contextlib.contextmanager
def skewable_broker(tmp_path: Path, args: list[str]):
    """(broker, clock file): write "+120" or "-30" to the clock file to move the broker's wall clock
    (its monotonic clock stays)."""
    clock = tmp_path / "clock"
    clock.write_text("+0\n")
    b = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", args)
    b.env = dict(os.environ, LD_PRELOAD=FAKETIME, FAKETIME_TIMESTAMP_FILE=str(clock), FAKETIME_CACHE_DURATION="1",
                 DONT_FAKE_MONOTONIC="1")
    b.start()
    try:
        yield b, clock
    finally:
        if b.proc is not None and b.proc.poll() is None:
            b.proc.kill()
            b.proc.wait(10)
