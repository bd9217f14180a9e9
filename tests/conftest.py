"""Fixtures shared by every test: real broker processes on free loopback ports."""

from __future__ import annotations

import os
import ssl
import subprocess
import urllib.request
from pathlib import Path

import pytest

from support.brokers import TXBROKER, BrokerProcess, free_port  # noqa: F401 - re-exported to the tests

REPO = Path(__file__).resolve().parent.parent


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


def run_cli(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([TXBROKER, *args], capture_output=True, text=True, timeout=60, input=input,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if check and r.returncode != 0:
        raise AssertionError(f"txbroker {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


_HASHES: dict[tuple[str, str], str] = {}


def write_credentials(path: Path, users: dict[str, dict]) -> Path:
    """Write a credentials file (broker --auth-file): access key -> fields, with "secret" hashed.
    The secret of each user is `<access key>-secret` unless a "secret" is given; its hash is made
    once per test process, so rewriting a file changes only what the test changes (a new salt
    would count as new credentials). Written atomically, as `txbroker auth` and Kubernetes do."""
    from txbroker.cli.auth_cmd import _user_block
    from txbroker.broker.auth import hash_secret

    blocks = []
    for key, fields in users.items():
        fields = dict(fields)
        secret = fields.pop("secret", f"{key}-secret")
        scram = _HASHES.get((key, secret))
        if scram is None:
            scram = _HASHES[(key, secret)] = hash_secret(secret).encode()
        blocks.append(_user_block({"access_key": key, "scram": scram, **fields}))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(blocks))
    os.replace(tmp, path)
    return path


def metric(broker: "BrokerProcess", name: str, **labels) -> float:
    """One sample of the broker's /metrics (0 if absent)."""
    import re

    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=5, context=broker.admin_tls) as r:
        text = r.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" ([0-9.e+-]+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


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
