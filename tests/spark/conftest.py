"""Fixtures for the Spark tests: one local SparkSession per test process, and per test a real broker
whose producer group requires jobs (no checker, no ledger: the broker keeps each write's decision).

The tests need pyspark (with pyarrow) and Java; without them they are skipped.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spark_helpers import GROUP, GROUP_SETTINGS, ClusterEnv, TxEnv, admin  # noqa: E402
from support import spark_cds  # noqa: E402

# Every driver JVM these tests start (the session below, spark_driver.py, orders_job.py, the demo)
# inherits this: Spark's classes from the archive `make test` builds, C1 only (support/spark_cds.py),
# and a temporary directory of this test process's, removed when it exits: a Spark session leaves an
# empty artifacts-<uuid> directory behind in java.io.tmpdir even when it stops cleanly, and a
# SIGKILLed driver leaves its block manager's files there too.
_JVM_TMP = tempfile.mkdtemp(prefix="txbroker-spark-tests-")
atexit.register(shutil.rmtree, _JVM_TMP, True)
os.environ.setdefault("SPARK_SUBMIT_OPTS", f"{spark_cds.java_options()} -Djava.io.tmpdir={_JVM_TMP}")

_MISSING = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
if shutil.which("java") is None:
    _MISSING.append("java")


def pytest_collection_modifyitems(config, items):
    if not _MISSING:
        return
    skip = pytest.mark.skip(reason=f"Spark tests need {', '.join(_MISSING)} (pip install -e '.[spark]'; a JDK)")
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark():
    from txbroker_spark import local_session

    session = local_session("txbroker-spark-tests", "local[2,4]", log_level="ERROR")
    yield session
    session.stop()


@pytest.fixture
def tx_env(broker_factory):
    """A broker with fast check-back and the group's settings (it requires jobs)."""
    broker = broker_factory("--check-interval-ms", "300", "--transaction-timeout-ms", "200")
    admin(broker.admin_url, "PUT", f"/api/v1/groups/{GROUP}/transaction", GROUP_SETTINGS)
    return TxEnv(broker=broker)


@pytest.fixture
def cluster_env(tmp_path):
    """Two broker groups (each a SYNC master and its slave, one cluster file), the group's settings
    on both."""
    from support.groups import start_cluster

    c = start_cluster(tmp_path)
    try:
        for g in c.groups:
            admin(g.master.admin_url, "PUT", f"/api/v1/groups/{GROUP}/transaction", GROUP_SETTINGS)
        yield ClusterEnv(c)
    finally:
        c.stop()
