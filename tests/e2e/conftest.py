"""Fixtures for the end-to-end tests, which run on the real one-node cluster of testbed/cluster.sh:
our images under containerd and runc, the operator in a pod, Services through kube-proxy, names
through CoreDNS, volumes from the node's provisioner.

`make test` brings the cluster up and runs these tests inside its network (`make test-e2e`). They
never skip: without a cluster, or outside its network, every test fails saying how to get one.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))   # cluster, operator_env
from cluster import ROOT, VERSION, Cluster, ClusterError  # noqa: E402
from support.waiting import wait_until  # noqa: E402

# Tags the rolling-update tests move TxBrokers to: the broker image under other names, as a user's
# registry would hold a newer build (the node cannot pull; testbed/cluster.sh loads images)
EXTRA_BROKER_TAGS = ("v2", "v3")


@pytest.fixture(scope="session")
def testbed() -> Cluster:
    try:
        c = Cluster()
        c.check_reachable()
    except ClusterError as e:
        pytest.fail(str(e), pytrace=False)
    with c.exclusive("image-tags"):
        for tag in EXTRA_BROKER_TAGS:
            c.run("ctr", "-a", c.sock, "-n", "k8s.io", "images", "tag", "--force",
                  f"docker.io/txbroker/broker:{VERSION}", f"docker.io/txbroker/broker:{tag}")
    return c


@pytest.fixture(scope="session")
def crds(testbed: Cluster) -> Cluster:
    """The project's CRDs, applied and Established."""
    with testbed.exclusive("crds"):
        testbed.kubectl("apply", "-f", str(ROOT / "crds"))
    testbed.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/txbrokers.txbroker.dev", "crd/txproducergroups.txbroker.dev")
    return testbed


@pytest.fixture
def namespace(testbed: Cluster, request: pytest.FixtureRequest):
    """A fresh namespace per test, deleted after it without waiting: the namespace controller
    removes its objects, and the kubelet stops its pods, during the run."""
    name = f"t-{request.node.name[:30].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:6]}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-")
    testbed.create_namespace(name)
    wait_until(lambda: testbed.get("serviceaccount", "default", name), 60, f"namespace {name}'s default ServiceAccount")
    yield name
    testbed.delete_namespace(name)
