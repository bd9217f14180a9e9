"""Fixtures for the end-to-end tests: a real kube-apiserver + etcd + kube-controller-manager + local
kubelet per worker.

The binaries are built (first run only, about 7-25 min on 2 cores; cached under ~/.cache/txbroker/k8s-bin)
while pytest collects - before any test starts, so the build does not eat a test's timeout. Under
pytest-xdist every worker runs the build step too; a file lock makes all but one wait, and they
then find the binaries in place. Set TXBROKER_K8S_BIN to use prebuilt binaries instead.

Each worker then starts its own testbed (session fixture `testbed`) and stops it at the end.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "k8s"))
sys.path.insert(0, str(Path(__file__).resolve().parent))   # operator_env
import k8s_testbed  # noqa: E402

ROOT = k8s_testbed.ROOT
_build_error: str | None = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    global _build_error
    if not any(item.get_closest_marker("e2e") for item in items):
        return
    try:
        k8s_testbed.build()
    except k8s_testbed.TestbedError as e:
        _build_error = f"cannot build the Kubernetes testbed:\n{e}"


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory):
    if _build_error:
        pytest.fail(_build_error, pytrace=False)
    tb = k8s_testbed.Testbed(tmp_path_factory.mktemp("testbed"))
    try:
        tb.start()
    except k8s_testbed.TestbedError as e:
        pytest.fail(str(e), pytrace=False)
    yield tb
    tb.stop()


@pytest.fixture(scope="session")
def crds(testbed):
    """The project's CRDs, applied and Established."""
    testbed.kubectl("apply", "-f", str(ROOT / "crds"))
    testbed.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/txbrokers.txbroker.dev", "crd/txproducergroups.txbroker.dev")
    return testbed


@pytest.fixture
def namespace(testbed, request):
    """A fresh namespace per test, deleted after it without waiting: the controller manager's namespace
    controller removes its objects, so a finished test's pods (their processes) go away during the run."""
    name = f"t-{request.node.name[:30].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:6]}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-")
    yield testbed.create_namespace(name)
    testbed.delete_namespace(name)
