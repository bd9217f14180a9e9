"""Smoke test of the operator: TxBroker in, broker processes answering /healthz out.

The operator runs as `python -m txbroker_operator` (Kopf) with the ServiceAccount token that the
Helm chart's RBAC grants, so the chart's least-privilege rules are exercised too: it watches one
namespace (`operator.watchNamespaces`, a Role there), where these tests put their TxBrokers, so
TxBrokers that other tests create elsewhere on this testbed are left alone. The local kubelet
runs the broker pods' `txbroker broker ...` command from PATH (.venv/bin first).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest
import yaml
from k8s_testbed import ROOT, wait_for

pytestmark = pytest.mark.e2e

CHART = str(ROOT / "helm" / "txbroker")
IMAGE = "txbroker/broker:test"     # never pulled: the local kubelet runs `txbroker` from PATH


def healthz(ip: str, path: str = "/healthz") -> int:
    with urllib.request.urlopen(f"http://{ip}:10912{path}", timeout=2) as r:
        return r.status


def ready(pod: dict | None) -> bool:
    conds = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


@pytest.fixture(scope="module")
def operator(crds, tmp_path_factory):
    """The chart's RBAC installed, and the operator running with its ServiceAccount's token."""
    tb = crds
    if not shutil.which("txbroker", path=tb.pod_path):
        pytest.fail("the broker CLI `txbroker` is not on the pods' PATH "
                    f"({tb.pod_path.split(os.pathsep)[0]} first): install the project "
                    "(`make venv`, pip install -e .) - contract: txbroker broker --data-dir DIR --listen "
                    "HOST:PORT --admin-listen HOST:PORT --role master|slave [--master HOST:PORT]", pytrace=False)
    ns = tb.create_namespace("txbroker-system")
    watched = tb.create_namespace("txbroker-e2e")
    tb.helm("upgrade", "--install", "op", CHART, "-n", ns, "--set", "operator.replicas=0",
            "--set", f"operator.watchNamespaces={{{watched}}}")
    sa = "op-txbroker-operator"
    token = tb.kubectl("-n", ns, "create", "token", sa, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(tb.kubeconfig.read_text())
    work = tmp_path_factory.mktemp("operator")
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "op",
        "clusters": admin["clusters"],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "op", "context": {"cluster": admin["clusters"][0]["name"], "user": sa}}],
    }))
    log_path = work / "operator.log"
    env = tb.env(KUBECONFIG=str(kubeconfig),
                 PYTHONPATH=os.pathsep.join([str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]))
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "txbroker_operator", f"--namespace={watched}", "--verbose"],
                                env=env, stdout=logf, stderr=subprocess.STDOUT, cwd=work)
    op = type("Operator", (), {"proc": proc, "log": log_path, "testbed": tb, "namespace": watched})
    yield op
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    text = log_path.read_text(errors="replace")
    denied = [line for line in text.splitlines() if re.search(r'Forbidden|HTTP/1\.1" 403', line)]
    assert not denied, "the operator hit RBAC denials:\n" + "\n".join(denied[:5])


def wait_broker(op, namespace: str, name: str, timeout: float = 90) -> dict:
    tb = op.testbed

    def running():
        assert op.proc.poll() is None, "operator exited:\n" + op.log.read_text()[-4000:]
        txb = tb.get("txb", name, namespace)
        return txb if (txb.get("status") or {}).get("phase") == "Running" else None
    try:
        return wait_for(running, timeout, f"TxBroker {name} Running")
    except TimeoutError:
        pods = tb.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False).stdout
        logs = "".join(tb.pod_log(f"{name}-{i}", namespace)[-2000:] for i in range(3))
        raise AssertionError(f"{name} not Running. pods:\n{pods}\nbroker logs:\n{logs}\n"
                             f"operator log:\n{op.log.read_text()[-3000:]}")


def test_single_broker_comes_up(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply({"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxBroker", "metadata": {"name": "solo"},
              "spec": {"image": IMAGE, "replicas": 1}}, namespace)
    txb = wait_broker(operator, namespace, "solo")
    assert txb["status"]["master"] == "solo-0"
    assert not txb["metadata"].get("finalizers")     # deleting a TxBroker never needs the operator
    assert txb["status"]["observedGeneration"] == txb["metadata"]["generation"]
    pod = tb.get("pod", "solo-0", namespace)
    assert ready(pod)
    assert pod["metadata"]["ownerReferences"][0]["name"] == "solo"
    assert pod["metadata"]["labels"]["txbroker.dev/role"] == "master"
    assert healthz(pod["status"]["podIP"]) == 200
    assert healthz(pod["status"]["podIP"], "/readyz") == 200
    master_svc = tb.get("service", "solo-master", namespace)
    assert master_svc["spec"]["selector"]["txbroker.dev/role"] == "master"
    assert tb.get("service", "solo", namespace)["spec"]["clusterIP"] == "None"
    row = tb.kubectl("-n", namespace, "get", "txb", "solo", "--no-headers").stdout.split()
    assert row[:5] == ["solo", "1", "solo-0", "1", "Running"]


def test_master_and_slave_come_up(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply({"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxBroker", "metadata": {"name": "duo"},
              "spec": {"image": IMAGE, "replicas": 2, "replication": "SYNC"}}, namespace)
    txb = wait_broker(operator, namespace, "duo")
    master, slave = tb.get("pod", "duo-0", namespace), tb.get("pod", "duo-1", namespace)
    args = slave["spec"]["containers"][0]["args"]
    assert args[args.index("--role") + 1] == "slave"
    assert args[args.index("--master") + 1] == f"{master['status']['podIP']}:10911"
    assert args[args.index("--replication-mode") + 1] == "SYNC"      # spec.replication reaches the broker
    for pod in (master, slave):
        assert healthz(pod["status"]["podIP"]) == 200
    assert [(b["name"], b["role"], b["ready"]) for b in txb["status"]["brokers"]] == \
        [("duo-0", "master", True), ("duo-1", "slave", True)]

    # scale down: the slave's pod is deleted (the kubelet stops its process), the master stays
    slave_pids = tb.pod_pids("duo-1", namespace)
    tb.kubectl("-n", namespace, "patch", "txb", "duo", "--type=merge", "-p", '{"spec": {"replicas": 1}}')
    wait_for(lambda: tb.get("pod", "duo-1", namespace) is None, 30, "pod duo-1 deleted")
    assert slave_pids and not tb.pod_pids("duo-1", namespace)
    txb = wait_for(lambda: (t := tb.get("txb", "duo", namespace))["status"]["observedGeneration"] == 2
                   and len(t["status"]["brokers"]) == 1 and t, 30, "duo status after scale-down")
    assert txb["status"]["phase"] == "Running" and txb["status"]["master"] == "duo-0"


def test_killed_broker_is_restarted_and_reported(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply({"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxBroker", "metadata": {"name": "phoenix"},
              "spec": {"image": IMAGE, "replicas": 1}}, namespace)
    wait_broker(operator, namespace, "phoenix")
    tb.kill_pod("phoenix-0", namespace, signal.SIGKILL)
    wait_for(lambda: tb.get("pod", "phoenix-0", namespace)["status"]["containerStatuses"][0]["restartCount"] == 1,
             30, "phoenix-0 restarted")
    pod = wait_for(lambda: (p := tb.get("pod", "phoenix-0", namespace)) and ready(p) and p, 30, "phoenix-0 Ready again")
    assert healthz(pod["status"]["podIP"]) == 200
    txb = wait_for(lambda: (t := wait_broker(operator, namespace, "phoenix"))["status"]["brokers"][0]["ready"] and t,
                   30, "phoenix reported ready")
    assert txb["status"]["phase"] == "Running"
