"""txbroker as a user runs it: the chart's operator in a pod, a TxBroker of three brokers on
PersistentVolumeClaims, producers and consumers in pods that know the brokers by their Service's
DNS name, all in containers of the images built from our Dockerfiles, under containerd and runc.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from cluster import BROKER_IMAGE, Cluster, ready
from support.waiting import wait_until
from operator_env import OPERATOR_NAMESPACE, finished, read_topic, start_operator, txbroker, wait_rolled

from support.refusals import end_transaction_refusal

pytestmark = pytest.mark.e2e

WORKLOADS = Path(__file__).resolve().parent / "workloads"


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-user-{worker_id}", resync_seconds=2)


@pytest.fixture
def namespace(operator):
    """The namespace the module's operator watches; each test names its own TxBroker."""
    return operator.namespace


def workload_pod(name: str, *args: str, restart: str = "Never") -> dict:
    """A pod of the broker image running `python ARGS...`, with tests/e2e/workloads/ mounted at /workloads
    (from a ConfigMap)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "orders"}},
            "spec": {"restartPolicy": restart,
                     "containers": [{"name": "main", "image": BROKER_IMAGE, "command": ["python", *args],
                                     "volumeMounts": [{"name": "workloads", "mountPath": "/workloads"}]}],
                     "volumes": [{"name": "workloads", "configMap": {"name": "workloads"}}]}}


def install_workloads(c: Cluster, namespace: str) -> None:
    c.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "workloads"},
             "data": {"tx_producer.py": (WORKLOADS / "tx_producer.py").read_text()}}, namespace)


def consumed_bodies(c: Cluster, namespace: str, address: str, topic: str, pod: str) -> list[str]:
    """Every committed message of `topic`, read by a consumer pod: its bodies, in order."""
    return [line.rsplit(" ", 1)[1] for line in read_topic(c, namespace, address, topic, pod)]


def acked(c: Cluster, namespace: str, pod: str) -> list[str]:
    return [line.split()[1] for line in c.logs(pod, namespace).splitlines() if line.startswith("ACK ")]


def wait_ready(op, namespace: str, name: str, replicas: int, timeout: float = 180) -> dict:
    c = op.testbed

    def check():
        t = c.get("txb", name, namespace)
        st = (t or {}).get("status") or {}
        return st.get("phase") == "Running" and len(st.get("brokers", [])) == replicas and t
    try:
        return wait_until(check, timeout, f"TxBroker {name} Ready with {replicas} brokers")
    except TimeoutError:
        raise AssertionError(f"{name} not Ready: {json.dumps(c.get('txb', name, namespace), indent=1)[-3000:]}\n"
                             + c.kubectl("-n", namespace, "get", "pods,pvc", "-o", "wide").stdout
                             + op.log.read_text()[-3000:]) from None


def test_the_operator_runs_in_its_pod_as_the_chart_says(operator):
    c = operator.testbed
    pod = operator.pods()[0]
    assert ready(pod)
    assert pod["spec"]["serviceAccountName"] == operator.deployment
    name = pod["metadata"]["name"]
    # enforced by the runtime, not only written in the spec
    assert c.exec(name, OPERATOR_NAMESPACE, "id", "-u").stdout.strip() == "65532"
    touch = c.exec(name, OPERATOR_NAMESPACE, "touch", "/written")
    assert touch.returncode != 0 and "Read-only file system" in touch.stderr
    assert c.exec(name, OPERATOR_NAMESPACE, "touch", "/tmp/written").returncode == 0
    # it reaches the API server through the `kubernetes` Service with its ServiceAccount's token
    log = operator.log.read_text()
    assert "Traceback" not in log, log[-3000:]


def test_a_trio_on_volumes_serves_producers_and_consumers_in_pods(operator, namespace):
    c = operator.testbed
    c.apply(txbroker("trio", replicas=3, replication="SYNC", flush="SYNC", storage={"size": "1Gi"}), namespace)
    t = wait_ready(operator, namespace, "trio", 3)
    assert t["status"]["master"] == "trio-0"
    # each broker on a claim the node's provisioner bound to a volume
    claims = c.list("pvc", namespace)
    assert len(claims) == 3 and all(p["status"]["phase"] == "Bound" for p in claims), claims
    # `kubectl get txb` as a user reads it
    table = c.kubectl("-n", namespace, "get", "txb", "trio").stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "REPLICAS", "MASTER", "EPOCH", "PHASE"]
    assert table[1].split()[:5] == ["trio", "3", "trio-0", "1", "Running"]

    address = f"trio-master.{namespace}.svc.cluster.local:10911"
    install_workloads(c, namespace)
    c.apply(workload_pod("trio-producer", "/workloads/tx_producer.py", address, "Orders", "orders-pg", "200"),
            namespace)
    p = wait_until(lambda: finished(c, namespace, "trio-producer"), 180, "the producer pod to finish")
    assert p["status"]["phase"] == "Succeeded", c.logs("trio-producer", namespace)
    sent = acked(c, namespace, "trio-producer")
    assert len(sent) == 200
    # a consumer in another pod receives exactly the committed messages, once each
    got = consumed_bodies(c, namespace, address, "Orders", "trio-consumer")
    assert sorted(got) == sorted(sent)
    # the slaves hold them too (SYNC replication), on their own volumes
    for slave in ("trio-1", "trio-2"):
        ip = c.get("pod", slave, namespace)["status"]["podIP"]
        assert Counter(consumed_bodies(c, namespace, f"{ip}:10911", "Orders", f"trio-consumer-{slave}")) == Counter(sent)


def crash_loop(c: Cluster, namespace: str, pod: str):
    """A wait_until predicate: SIGKILL the pod's container whenever the kubelet has restarted it (a
    master that crashes at start, again and again), until the operator has promoted another."""
    def check():
        try:
            c.kill_pod(pod, namespace)
        except LookupError:   # between a kill and the restart
            pass
        return c.get("txb", pod.rsplit("-", 1)[0], namespace)["status"]["master"] != pod
    return check


@pytest.mark.parametrize("loss", ["pod deleted", "container crash-looping"])
def test_failover_under_load_when_the_master_is_lost(operator, namespace, loss):
    c = operator.testbed
    fo = {"pod deleted": "fo", "container crash-looping": "fc"}[loss]   # the TxBroker's name
    c.apply(txbroker(fo, replicas=3, replication="SYNC", flush="SYNC", storage={"size": "1Gi"},
                     transaction={"checkIntervalSeconds": 1, "timeoutSeconds": 1},
                     failover={"gracePeriodSeconds": 3}), namespace)
    wait_ready(operator, namespace, fo, 3)
    wait_until(lambda: all(b.get("inSync") for b in c.get("txb", fo, namespace)["status"]["brokers"]
                         if b["role"] == "slave"), 60, "slaves in sync")
    address = f"{fo}-master.{namespace}.svc.cluster.local:10911"
    install_workloads(c, namespace)
    c.apply(workload_pod(f"{fo}-producer", "/workloads/tx_producer.py", address, "Orders", "orders-pg", "3000"),
            namespace)
    wait_until(lambda: len(acked(c, namespace, f"{fo}-producer")) >= 100, 120, "commits before the failure")

    if loss == "pod deleted":
        c.kubectl("-n", namespace, "delete", "pod", f"{fo}-0", "--wait=false")
    else:   # the runtime restarts the container each time; the operator must still fail over
        try:
            wait_until(crash_loop(c, namespace, f"{fo}-0"), 120, "the operator to promote a slave", interval=0.1)
        except TimeoutError as e:
            events = [f"{ev['reason']}: {ev['message']}" for ev in c.events(namespace, fo)]
            raise AssertionError(f"{e}\nstatus: {c.get('txb', fo, namespace).get('status')}\nevents: {events}\n"
                                 f"operator log:\n{operator.log.read_text()[-4000:]}") from None
    # A deleted master's pod is a planned move since issue 32: its broker serves on while it hands over
    # (a switchover: Event Switchover, groups[].lastSwitchover); a crash-looping one fails over.
    planned = loss == "pod deleted"
    reason = "Switchover" if planned else "FailedOver"

    def moved(t):
        return (t["status"]["groups"][0].get("lastSwitchover") if planned else t["status"].get("lastFailover")) or {}

    txb = wait_until(lambda: (t := c.get("txb", fo, namespace)) and t["status"].get("master") not in (None, f"{fo}-0")
                   and moved(t).get("from") == f"{fo}-0" and t, 120, "the operator to promote a slave")
    new_master = txb["status"]["master"]
    assert txb["status"]["epoch"] >= 2
    assert any(e["reason"] == reason for e in c.events(namespace, fo))
    # the Service follows the new master, and the producer goes on through the same name
    new_ip = c.get("pod", new_master, namespace)["status"]["podIP"]
    wait_until(lambda: [a["ip"] for s in (c.get("endpoints", f"{fo}-master", namespace) or {}).get("subsets", [])
                      for a in s.get("addresses", [])] == [new_ip], 60, f"{fo}-master following {new_master}")
    p = wait_until(lambda: finished(c, namespace, f"{fo}-producer"), 300, "the producer to finish after the failover")
    assert p["status"]["phase"] == "Succeeded", c.logs(f"{fo}-producer", namespace)[-3000:]

    # SYNC replication: every acknowledged commit is on the new master, once; nothing else appears
    sent = acked(c, namespace, f"{fo}-producer")
    got = consumed_bodies(c, namespace, address, "Orders", f"{fo}-consumer")
    assert not [b for b, n in Counter(got).items() if n > 1]
    assert set(sent) <= set(got), sorted(set(sent) - set(got))[:20]
    assert set(got) <= {f"m-{i}" for i in range(3000)}

    # the old master's pod comes back on its own volume, as a slave that refuses END_TRANSACTION
    back = wait_until(lambda: (p := c.get("pod", f"{fo}-0", namespace)) and ready(p) and p, 180, f"{fo}-0 back and ready")
    assert back["metadata"]["labels"]["txbroker.dev/role"] == "slave"
    wait_until(lambda: any(b["name"] == f"{fo}-0" and b["role"] == "slave" and b.get("inSync")
                         for b in c.get("txb", fo, namespace)["status"]["brokers"]), 120, f"{fo}-0 in sync as a slave")
    back_ip = back["status"]["podIP"]
    assert Counter(consumed_bodies(c, namespace, f"{back_ip}:10911", "Orders", f"{fo}-consumer-old")) == Counter(got)
    assert end_transaction_refusal(f"{back_ip}:10911", "orders-pg").code_name == "SLAVE_NOT_AVAILABLE"


@pytest.mark.timeout(600)
def test_rolling_update_and_scaling_under_load_keep_every_acknowledged_commit(operator, namespace):
    c = operator.testbed
    c.apply(txbroker("roll", replicas=3, replication="SYNC", flush="SYNC", storage={"size": "1Gi"},
                     transaction={"checkIntervalSeconds": 1, "timeoutSeconds": 1}), namespace)
    wait_ready(operator, namespace, "roll", 3)
    wait_until(lambda: all(b.get("inSync") for b in c.get("txb", "roll", namespace)["status"]["brokers"]
                         if b["role"] == "slave"), 60, "slaves in sync")
    address = f"roll-master.{namespace}.svc.cluster.local:10911"
    install_workloads(c, namespace)
    c.apply(workload_pod("roll-producer", "/workloads/tx_producer.py", address, "Orders", "orders-pg", "1000000"),
            namespace)
    wait_until(lambda: len(acked(c, namespace, "roll-producer")) >= 100, 120, "commits before the update")

    # a second image tag: one pod at a time, slaves first, the master's pod last after a switchover
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in c.list("pods", namespace, "txbroker.dev/broker=roll")}
    master_before = c.get("txb", "roll", namespace)["status"]["master"]
    c.kubectl("-n", namespace, "patch", "txb", "roll", "--type=merge", "-p", '{"spec": {"image": "txbroker/broker:v2"}}')
    _, order = wait_rolled(c, namespace, "roll", 3, "txbroker/broker:v2", 300, uids)
    assert order[-1] == master_before and len(order) == 3, order

    # scale 3 -> 2 -> 3 while the producer goes on
    c.kubectl("-n", namespace, "patch", "txb", "roll", "--type=merge", "-p", '{"spec": {"replicas": 2}}')
    wait_ready(operator, namespace, "roll", 2)
    c.kubectl("-n", namespace, "patch", "txb", "roll", "--type=merge", "-p", '{"spec": {"replicas": 3}}')
    wait_ready(operator, namespace, "roll", 3)

    before = len(acked(c, namespace, "roll-producer"))
    wait_until(lambda: len(acked(c, namespace, "roll-producer")) >= before + 100, 120, "commits after the changes")
    c.exec("roll-producer", namespace, "touch", "/tmp/stop", check=True)
    p = wait_until(lambda: finished(c, namespace, "roll-producer"), 120, "the producer to stop")
    assert p["status"]["phase"] == "Succeeded", c.logs("roll-producer", namespace)[-3000:]
    sent = acked(c, namespace, "roll-producer")
    got = consumed_bodies(c, namespace, address, "Orders", "roll-consumer")
    assert not [b for b, n in Counter(got).items() if n > 1]
    assert set(sent) <= set(got), sorted(set(sent) - set(got))[:20]
