"""Fixtures shared by every test: real broker processes on free loopback ports."""

from __future__ import annotations

import os
import ssl
import urllib.request
from pathlib import Path

import pytest

from support import ast_guard
from support.brokers import TXBROKER, BrokerProcess, free_port  # noqa: F401 - re-exported to the tests
from support.cli import run_cli  # noqa: F401 - re-exported to the tests
from support.credentials import write_credentials  # noqa: F401 - re-exported to the tests
from support.metrics import metric  # noqa: F401 - re-exported to the tests

REPO = Path(__file__).resolve().parent.parent

ast_guard.install()   # a failing test's report must not become an INTERNALERROR (support/ast_guard.py)


@pytest.fixture
def broker_factory(tmp_path):
    started: list[BrokerProcess] = []

    def make(*args: str, name: str = "broker", admin_tls: ssl.SSLContext | None = None) -> BrokerProcess:
        b = BrokerProcess(tmp_path / f"{name}-data", tmp_path / f"{name}.log", list(args), admin_tls)
        started.append(b)
        return b.start()

    yield make
    for b in started:
        if b.proc is not None and b.proc.poll() is None:
            b.proc.kill()
            b.proc.wait(10)


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    """A master with fast check-back (0.3 s interval, 0.2 s timeout) and ASYNC flush."""
    return broker_factory("--check-interval-ms", "300", "--transaction-timeout-ms", "200")


def pytest_collection_modifyitems(config, items):
    """Longest first: the tests marked slow, then the fault schedules and Spark's, then the rest.
    Spread over workers (`-n`, work stealing), the long ones start at once instead of one of them
    running alone at the end while the other worker idles."""
    def weight(item) -> int:
        path = str(item.fspath)
        if item.get_closest_marker("slow"):
            return 0
        if "/tests/faults/" in path:
            return 1
        if "/tests/spark/" in path:
            return 2
        return 3

    items.sort(key=weight)  # stable: the order within each weight stays as collected
