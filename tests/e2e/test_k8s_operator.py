"""The operator end to end: TxBrokers become broker processes that replicate, fail over, scale, roll
and go away with their TxBroker; TxProducerGroups change running brokers' check-back live.
How the operator runs: tests/e2e/operator_env.py.
"""

from __future__ import annotations

import threading

import pytest
from k8s_testbed import wait_for
from operator_env import (
    addresses, admin, broker_info, condition, events_for, healthz, ready, start_operator, txbroker, wait_broker,
)
from support import txload

from txbroker.client import BrokerError, LocalTransactionState as S, Message, TransactionListener, TransactionProducer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def operator(crds, tmp_path_factory):
    yield from start_operator(crds, tmp_path_factory)


def test_single_broker_comes_up(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("solo", replicas=1), namespace)
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
    config = tb.get("configmap", "solo-config", namespace)
    assert 'flush_disk_type = "ASYNC"' in config["data"]["broker.toml"]
    assert tb.get("serviceaccount", "solo-broker", namespace)["automountServiceAccountToken"] is False
    assert tb.get("pdb", "solo", namespace) is None        # one broker: nothing to budget
    row = tb.kubectl("-n", namespace, "get", "txb", "solo", "--no-headers").stdout.split()
    assert row[:5] == ["solo", "1", "solo-0", "1", "Running"]


def test_master_and_two_slaves_replicate_and_commit(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("trio", replicas=3, replication="SYNC", flush="SYNC"), namespace)
    wait_broker(operator, namespace, "trio")
    assert tb.get("pdb", "trio", namespace)["spec"]["maxUnavailable"] == 1
    assert broker_info(tb, namespace, "trio-0")["role"] == "master"
    for slave in ("trio-1", "trio-2"):
        info = broker_info(tb, namespace, slave)
        assert info["role"] == "slave" and info["master"] == addresses(tb, namespace, "trio", 1)[0]

    class Commit(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return S.COMMIT

        def check_local_transaction(self, msg):
            return S.COMMIT

    with TransactionProducer("trio-pg", addresses(tb, namespace, "trio", 3), Commit()) as p:
        for i in range(30):
            r = p.send_message_in_transaction(Message("Orders", f"order-{i}".encode()), None)
            assert r.local_state is S.COMMIT and not r.end_error

    end = broker_info(tb, namespace, "trio-0")["log_end_offset"]

    def replicated():
        brokers = tb.get("txb", "trio", namespace)["status"]["brokers"]
        slaves = [b for b in brokers if b["role"] == "slave"]
        return (len(slaves) == 2 and all(b.get("inSync") and b.get("lag") == 0 for b in slaves)
                and all(b.get("offset") == end for b in brokers) and brokers)
    wait_for(replicated, 30, f"status: both slaves in sync at the master's offset {end}")
    for slave in ("trio-1", "trio-2"):
        assert broker_info(tb, namespace, slave)["log_end_offset"] == end


def test_producer_group_settings_reach_running_brokers(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("pgb", replicas=2), namespace)
    wait_broker(operator, namespace, "pgb")
    pids = {p: tb.pod_pids(p, namespace) for p in ("pgb-0", "pgb-1")}
    tb.apply({"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxProducerGroup", "metadata": {"name": "payments"},
              "spec": {"brokerRef": {"name": "pgb"}, "checkIntervalSeconds": 2, "timeoutSeconds": 1}}, namespace)

    def applied(generation):
        def check():
            g = tb.get("txpg", "payments", namespace)
            st = g.get("status") or {}
            return (st.get("observedGeneration") == generation and sorted(a["name"] for a in st.get("applied", []))
                    == ["pgb-0", "pgb-1"] and all(a["generation"] == generation for a in st["applied"])
                    and (condition(g, "Applied") or {}).get("status") == "True" and g)
        return check
    wait_for(applied(1), 30, "generation 1 applied to both brokers")
    for pod in ("pgb-0", "pgb-1"):
        groups = admin(tb.get("pod", pod, namespace)).get("/api/v1/groups")
        assert groups["payments"]["check_interval_ms"] == 2000 and groups["payments"]["generation"] == 1

    checked = threading.Event()

    class LeftUnknown(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return S.UNKNOWN

        def check_local_transaction(self, msg):
            checked.set()
            return S.COMMIT

    with TransactionProducer("payments", addresses(tb, namespace, "pgb", 2), LeftUnknown()) as p:
        r = p.send_message_in_transaction(Message("Payments", b"pay-1"), None)
        assert r.local_state is S.UNKNOWN
        # the broker-wide default is a 60 s check interval: a check within 20 s is the group's 2 s
        wait_for(checked.is_set, 20, "a check-back under the group's 2 s interval")
        wait_for(lambda: txload.visible(addresses(tb, namespace, "pgb", 1)[0], "Payments") == {"pay-1": 1},
                 20, "the checked transaction committed and visible")

    tb.kubectl("-n", namespace, "patch", "txpg", "payments", "--type=merge", "-p", '{"spec": {"checkIntervalSeconds": 30}}')
    wait_for(applied(2), 30, "generation 2 applied to both brokers")
    for pod in ("pgb-0", "pgb-1"):
        assert admin(tb.get("pod", pod, namespace)).get("/api/v1/groups")["payments"]["check_interval_ms"] == 30000
    assert {p: tb.pod_pids(p, namespace) for p in ("pgb-0", "pgb-1")} == pids, "a broker was restarted"
    row = tb.kubectl("-n", namespace, "get", "txpg", "payments", "--no-headers").stdout.split()
    assert row[:5] == ["payments", "pgb", "30", "0", "True"]

    # a group naming a missing TxBroker says so
    tb.apply({"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxProducerGroup", "metadata": {"name": "stray"},
              "spec": {"brokerRef": {"name": "nope"}}}, namespace)
    g = wait_for(lambda: (g := tb.get("txpg", "stray", namespace)) and condition(g, "Ready") and g, 30, "stray status")
    assert condition(g, "Ready")["reason"] == "BrokerNotFound"

    # deleting the group removes its settings from the brokers (no finalizer needed)
    tb.kubectl("-n", namespace, "delete", "txpg", "payments")
    wait_for(lambda: all("payments" not in admin(tb.get("pod", p, namespace)).get("/api/v1/groups")
                         for p in ("pgb-0", "pgb-1")), 30, "group settings removed from the brokers")


@pytest.mark.slow
def test_failover_under_load_keeps_every_acknowledged_commit(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("fo", replicas=3, replication="SYNC", flush="SYNC",
                      transaction={"checkIntervalSeconds": 1, "timeoutSeconds": 1},
                      failover={"gracePeriodSeconds": 3}), namespace)
    wait_broker(operator, namespace, "fo")
    wait_for(lambda: all(b.get("inSync") for b in tb.get("txb", "fo", namespace)["status"]["brokers"]
                         if b["role"] == "slave"), 30, "slaves in sync")
    everyone = addresses(tb, namespace, "fo", 3)
    ledger, acked, stop = txload.Ledger(), {}, threading.Event()
    loader = threading.Thread(target=txload.run_load, args=(everyone, ledger, acked, stop, 4))
    loader.start()
    try:
        wait_for(lambda: len(acked) >= 100, 60, "load before the failure")

        def crash_until_replaced():
            # SIGKILL the master's process whenever the kubelet restarts it: a crash-looping master
            try:
                tb.kill_pod("fo-0", namespace)
            except LookupError:   # not restarted yet
                pass
            return tb.get("txb", "fo", namespace)["status"]["master"] != "fo-0"
        try:
            wait_for(crash_until_replaced, 60, "the operator to promote a slave", interval=0.1)
        except TimeoutError:
            raise AssertionError("no failover; operator log:\n" + operator.log.read_text()[-5000:])
        txb = wait_for(lambda: (t := tb.get("txb", "fo", namespace)) and condition(t, "FailedOver") and t, 30,
                       "the FailedOver condition")
        new_master = txb["status"]["master"]
        assert new_master in ("fo-1", "fo-2") and txb["status"]["epoch"] >= 2
        assert condition(txb, "FailedOver")["status"] == "True"
        # the <name>-master Service selects the new master's pod (its endpoints follow: see test_k8s_controllers)
        selector = tb.get("service", "fo-master", namespace)["spec"]["selector"]
        labels = tb.get("pod", new_master, namespace)["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector.items())
        assert txb["status"]["lastFailover"]["from"] == "fo-0"
        assert any(e["reason"] == "FailedOver" and e["type"] == "Warning" for e in events_for(tb, namespace, "fo"))
        assert tb.get("pod", new_master, namespace)["metadata"]["labels"]["txbroker.dev/role"] == "master"
        assert broker_info(tb, namespace, new_master)["role"] == "master"
        before = len(acked)
        wait_for(lambda: len(acked) >= before + 50, 60, "producers to continue on the new master")
    finally:
        stop.set()
        loader.join(60)

    # the old master comes back as a slave of the new one, and refuses END_TRANSACTION
    old = wait_for(lambda: (p := tb.get("pod", "fo-0", namespace)) and ready(p) and p, 60, "fo-0 back and ready")
    assert old["metadata"]["labels"]["txbroker.dev/role"] == "slave"
    wait_for(lambda: broker_info(tb, namespace, "fo-0")["role"] == "slave", 30, "fo-0 running as a slave")
    with TransactionProducer("orders-pg", everyone, ledger):   # answers the new master's check-backs
        new_ip = tb.get("pod", new_master, namespace)["status"]["podIP"]
        wait_for(lambda: txload.settled(f"http://{new_ip}:10912"), 60, "every transaction decided on the new master")
        from txbroker.client.connection import BrokerClient
        from txbroker.protocol.bodies import EndTransactionRequest
        from txbroker.protocol.codes import RequestCode, TransactionState
        import asyncio

        async def end_on_old_master():
            c = BrokerClient(everyone[0], require_master=False)
            try:
                await c.request(RequestCode.END_TRANSACTION,
                                EndTransactionRequest("orders-pg", "t", TransactionState.COMMIT))
            finally:
                await c.close()
        with pytest.raises(BrokerError) as e:
            asyncio.run(end_on_old_master())
        assert e.value.code_name == "SLAVE_NOT_AVAILABLE"
    seen = txload.visible(f"{new_ip}:10911")
    problems = txload.invariant_violations(seen, acked, must_keep_acked=True)
    assert not problems, problems[:5]
    wait_for(lambda: tb.get("txb", "fo", namespace)["status"]["phase"] == "Running", 60, "fo Running again")


def wait_rolled(tb, namespace: str, name: str, replicas: int, image: str, timeout: float) -> dict:
    """Wait until every pod runs `image` and the TxBroker is Running; assert no two brokers were
    down (deleted, being deleted or not ready) at any time we looked."""
    max_down = 0

    def rolled():
        nonlocal max_down
        pods = [tb.get("pod", f"{name}-{i}", namespace) for i in range(replicas)]
        max_down = max(max_down, sum(1 for p in pods if p is None or p["metadata"].get("deletionTimestamp")
                                     or not ready(p)))
        t = tb.get("txb", name, namespace)
        return (all(p and p["spec"]["containers"][0]["image"] == image and ready(p) for p in pods)
                and t["status"]["phase"] == "Running" and t)
    txb = wait_for(rolled, timeout, f"every {name} pod on {image}", interval=0.1)
    assert max_down <= 1, "more than one broker was down at once"
    return txb


@pytest.mark.slow
def test_scale_roll_and_delete(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("elastic", replicas=2), namespace)
    wait_broker(operator, namespace, "elastic")

    tb.kubectl("-n", namespace, "patch", "txb", "elastic", "--type=merge", "-p", '{"spec": {"replicas": 3}}')
    txb = wait_for(lambda: (t := tb.get("txb", "elastic", namespace))["status"].get("observedGeneration") == 2
                   and t["status"]["phase"] == "Running" and len(t["status"]["brokers"]) == 3 and t, 60, "3 brokers")
    assert broker_info(tb, namespace, "elastic-2")["role"] == "slave"

    # a new image: pods are replaced one at a time, slaves first, the master after a switchover
    uids = {i: tb.get("pod", f"elastic-{i}", namespace)["metadata"]["uid"] for i in range(3)}
    tb.kubectl("-n", namespace, "patch", "txb", "elastic", "--type=merge", "-p", '{"spec": {"image": "txbroker/broker:v2"}}')
    txb = wait_rolled(tb, namespace, "elastic", 3, "txbroker/broker:v2", 180)
    assert all(tb.get("pod", f"elastic-{i}", namespace)["metadata"]["uid"] != uids[i] for i in range(3))
    reasons = [e["reason"] for e in sorted(events_for(tb, namespace, "elastic"), key=lambda e: e["lastTimestamp"])]
    assert reasons.count("RollingUpdate") == 3 and "Switchover" in reasons
    assert "Fenced" not in reasons and "FailedOver" not in reasons     # planned: no surprise on the way
    assert txb["status"]["master"] != "elastic-0"      # the master moved before its pod was replaced

    tb.kubectl("-n", namespace, "patch", "txb", "elastic", "--type=merge", "-p", '{"spec": {"replicas": 2}}')
    txb = wait_for(lambda: (t := tb.get("txb", "elastic", namespace))["status"]["phase"] == "Running"
                   and len(t["status"]["brokers"]) == 2 and t, 90, "back to 2 brokers")
    wait_for(lambda: tb.get("pod", "elastic-2", namespace) is None, 60, "elastic-2 gone")
    assert txb["status"]["master"] in ("elastic-0", "elastic-1")

    # deleting the TxBroker takes everything it owns (garbage collection through owner references)
    tb.kubectl("-n", namespace, "delete", "txb", "elastic", "--wait=false")
    owned = [("pod", "elastic-0"), ("pod", "elastic-1"), ("service", "elastic"), ("service", "elastic-master"),
             ("configmap", "elastic-config"), ("serviceaccount", "elastic-broker"), ("pdb", "elastic")]
    wait_for(lambda: all(tb.get(k, n, namespace) is None for k, n in owned), 90, "everything elastic owned gone")


@pytest.mark.slow
def test_operator_killed_mid_roll_finishes_it_after_restart(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("steady", replicas=2), namespace)
    wait_broker(operator, namespace, "steady")
    tb.kubectl("-n", namespace, "patch", "txb", "steady", "--type=merge", "-p", '{"spec": {"image": "txbroker/broker:v3"}}')
    wait_for(lambda: any(e["reason"] == "RollingUpdate" for e in events_for(tb, namespace, "steady")), 60,
             "the roll to start")
    operator.kill()          # SIGKILL mid-change: nothing in memory survives
    operator.start()
    wait_rolled(tb, namespace, "steady", 2, "txbroker/broker:v3", 120)
    masters = [i for i in range(2) if broker_info(tb, namespace, f"steady-{i}")["role"] == "master"]
    assert len(masters) == 1
    assert tb.get("txb", "steady", namespace)["status"]["master"] == f"steady-{masters[0]}"
