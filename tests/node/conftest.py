"""Fixtures for the tests on the real node (testbed/cluster.sh): the cluster, a namespace per test,
and the chart installed once with the images built from our Dockerfiles.

These tests never skip: without a cluster, or outside its network, every test fails saying how to
bring one up. `make test` does that (testbed/run-node-tests.sh).
"""

from __future__ import annotations

import fcntl
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster import ROOT, VERSION, Cluster, ClusterError, wait_for  # noqa: E402

OPERATOR_NAMESPACE = "txbroker-system"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.node)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    try:
        c = Cluster()
        c.check_reachable()
    except ClusterError as e:
        pytest.fail(str(e), pytrace=False)
    return c


@pytest.fixture(scope="session")
def operator(cluster: Cluster) -> Cluster:
    """The chart installed as a user installs it (CRDs, RBAC, the operator Deployment), with the
    operator image built by testbed/images.sh; shared by every test of the session (under xdist,
    the first worker installs, the others find it)."""
    with open(cluster.dir / "chart.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cluster.helm("status", "txbroker", "-n", OPERATOR_NAMESPACE, check=False).returncode != 0:
            cluster.helm("upgrade", "--install", "txbroker", str(ROOT / "helm" / "txbroker"), "-n", OPERATOR_NAMESPACE,
                         "--create-namespace", "--set", f"operator.image.tag={VERSION}",
                         "--set", "operator.resyncSeconds=2", timeout=240)
    try:
        wait_for(lambda: cluster.kubectl("-n", OPERATOR_NAMESPACE, "wait", "--for=condition=Ready", "pod",
                                         "-l", "app.kubernetes.io/name=txbroker-operator", "--timeout=5s",
                                         check=False).returncode == 0, 180, "the operator's pod to be Ready")
    except TimeoutError as e:
        log = cluster.kubectl("-n", OPERATOR_NAMESPACE, "logs", "deployment/txbroker-txbroker-operator", check=False)
        pytest.fail(f"{e}\n{log.stdout[-3000:]}{log.stderr[-1000:]}", pytrace=False)
    return cluster


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest):
    """A fresh namespace per test, deleted after it without waiting."""
    name = f"t-{request.node.name[:30].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:6]}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-")
    cluster.kubectl("create", "namespace", name)
    wait_for(lambda: cluster.get("serviceaccount", "default", name), 60, f"namespace {name}'s default ServiceAccount")
    yield name
    cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")
