"""The operator end to end: TxBrokers become broker processes that replicate, fail over, scale, roll
and go away with their TxBroker; clients reach the master through `<name>-master`; what others edit
is put back; TxProducerGroups change running brokers' check-back live.
How the operator runs (a pod of the chart, one release per watched namespace): tests/e2e/operator_env.py.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from support.waiting import wait_until
from operator_env import (
    addresses, admin, broker_info, brokers_report, condition, end_transaction_refusal, events_for, healthz,
    ready, service_endpoints, start_operator, txbroker, wait_broker, wait_rolled,
)
from support import txload

from txbroker.client import ClientError, LocalTransactionState as S, Message, TransactionListener, TransactionProducer
from txbroker.client.admin import AdminClient

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-e2e-{worker_id}")


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return S.COMMIT

    def check_local_transaction(self, msg):
        return S.COMMIT


def txpg(name: str, broker: str, **spec) -> dict:
    return {"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxProducerGroup", "metadata": {"name": name},
            "spec": {"brokerRef": {"name": broker}, **spec}}


def group_applied(tb, namespace: str, name: str, generation: int, brokers: list[str]):
    """A wait_until predicate: the group's status says `generation` runs on exactly `brokers`."""
    def check():
        g = tb.get("txpg", name, namespace)
        st = g.get("status") or {}
        return (st.get("observedGeneration") == generation and st.get("appliedGeneration") == generation
                and sorted(a["name"] for a in st.get("applied", [])) == sorted(brokers)
                and all(a["generation"] == generation for a in st["applied"])
                and (condition(g, "Applied") or {}).get("status") == "True" and g)
    return check


class MasterServiceClient:
    """A transactional producer that knows the brokers only as the `<name>-master` Service: it sends
    to the Service's endpoints and, when they stop answering, reads them again (no kube-proxy here)."""

    def __init__(self, tb, namespace: str, service: str, group: str, topic: str):
        self.tb, self.namespace, self.service, self.group, self.topic = tb, namespace, service, group, topic
        self.committed: list[tuple[str, str]] = []    # (broker that acknowledged it, body)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def committed_at(self, endpoint: str) -> int:
        return sum(1 for e, _ in self.committed if e == endpoint)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                endpoints = service_endpoints(self.tb, self.namespace, self.service)
            except Exception:   # noqa: BLE001 - kubectl under load: ask again
                self.stop.wait(0.2)
                continue
            if not endpoints:   # between the old master leaving the slice and the new one joining
                self.stop.wait(0.2)
                continue
            try:
                with TransactionProducer(self.group, endpoints, Commit(), request_timeout=5) as p:
                    while not self.stop.is_set():
                        body = f"svc-{n}"
                        n += 1
                        r = p.send_message_in_transaction(Message(self.topic, body.encode()), None)
                        if r.local_state is S.COMMIT and not r.end_error:
                            self.committed.append((p.broker_address, body))   # the broker that took it
            except (ClientError, OSError):
                continue   # the endpoint stopped answering (or is no master now): resolve again

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


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
    assert tb.get("pdb", "trio", namespace)["spec"]["minAvailable"] == 2
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
    wait_until(replicated, 30, f"status: both slaves in sync at the master's offset {end}")
    for slave in ("trio-1", "trio-2"):
        assert broker_info(tb, namespace, slave)["log_end_offset"] == end


def test_producer_commits_through_the_master_service(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("front", replicas=2), namespace)
    wait_broker(operator, namespace, "front")
    master = addresses(tb, namespace, "front", 1)
    # the master, and only it: the slave's pod is ready too, but not labelled master
    endpoints = wait_until(lambda: (e := service_endpoints(tb, namespace, "front-master")) == master and e, 60,
                         "front-master's EndpointSlice holding front-0 only")
    with TransactionProducer("front-pg", endpoints, Commit()) as p:
        for i in range(10):
            r = p.send_message_in_transaction(Message("Front", f"f-{i}".encode()), None)
            assert r.local_state is S.COMMIT and not r.end_error
    assert txload.visible(master[0], "Front") == {f"f-{i}": 1 for i in range(10)}
    tb.kubectl("-n", namespace, "delete", "txb", "front", "--wait=false")


def test_producer_group_interval_change_changes_check_back_live(operator):
    tb, namespace = operator.testbed, operator.namespace
    # the broker-wide default is an hour as well, so the only short interval ever in force is the group's
    tb.apply(txbroker("pgb", replicas=2, transaction={"checkIntervalSeconds": 3600}), namespace)
    wait_broker(operator, namespace, "pgb")
    pids = {p: tb.pod_pids(p, namespace) for p in ("pgb-0", "pgb-1")}
    tb.apply(txpg("payments", "pgb", checkIntervalSeconds=3600, timeoutSeconds=1), namespace)
    wait_until(group_applied(tb, namespace, "payments", 1, ["pgb-0", "pgb-1"]), 30, "generation 1 on both brokers")
    for pod in ("pgb-0", "pgb-1"):
        groups = admin(tb.get("pod", pod, namespace)).get("/api/v1/groups")
        assert groups["payments"]["check_interval_ms"] == 3_600_000 and groups["payments"]["generation"] == 1
        assert groups["payments"]["require_job"] is False      # checkMode connection (the default)

    checked = threading.Event()

    class LeftUnknown(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return S.UNKNOWN

        def check_local_transaction(self, msg):
            checked.set()
            return S.COMMIT

    master = admin(tb.get("pod", "pgb-0", namespace))

    def pending_for(ms):
        """The group's one pending transaction, once it has been past its timeout for `ms`."""
        txs = master.get("/api/v1/transactions?group=payments&state=pending")["transactions"]
        return len(txs) == 1 and time.time() * 1000 - txs[0]["born_ms"] >= 1000 + ms and txs[0]

    with TransactionProducer("payments", addresses(tb, namespace, "pgb", 2), LeftUnknown()) as p:
        r = p.send_message_in_transaction(Message("Payments", b"pay-1"), None)
        assert r.local_state is S.UNKNOWN
        # Due, but at an hour's interval not checked: proving an absence takes time, here three of the
        # 2-second rounds it gets below
        tx = wait_until(lambda: pending_for(3 * 2000), 30, "the transaction past its timeout for 6 s")
        assert tx["checks"] == 0 and not checked.is_set(), "checked back at a one-hour interval"
        wait_until(lambda: (tb.get("txpg", "payments", namespace).get("status") or {}).get("pending") == 1, 30,
                 "status: one pending")

        tb.kubectl("-n", namespace, "patch", "txpg", "payments", "--type=merge", "-p",
                   '{"spec": {"checkIntervalSeconds": 2}}')
        wait_until(group_applied(tb, namespace, "payments", 2, ["pgb-0", "pgb-1"]), 30, "generation 2 on both brokers")
        wait_until(checked.is_set, 30, "a check-back under the group's new 2 s interval")
        wait_until(lambda: txload.visible(addresses(tb, namespace, "pgb", 1)[0], "Payments") == {"pay-1": 1},
                 20, "the checked transaction committed and visible")
    for pod in ("pgb-0", "pgb-1"):
        assert admin(tb.get("pod", pod, namespace)).get("/api/v1/groups")["payments"]["check_interval_ms"] == 2000
    assert {p: tb.pod_pids(p, namespace) for p in ("pgb-0", "pgb-1")} == pids, "a broker was restarted"
    header = tb.kubectl("-n", namespace, "get", "txpg", "payments").stdout.splitlines()[0].split()
    assert header[:6] == ["NAME", "BROKER", "CHECK-INTERVAL", "PENDING", "APPLIED", "APPLIED-GEN"]
    wait_until(lambda: tb.kubectl("-n", namespace, "get", "txpg", "payments", "--no-headers").stdout.split()[:6]
             == ["payments", "pgb", "2", "0", "True", "2"], 30, "kubectl get txpg: generation 2 applied, none pending")

    # a group naming a missing TxBroker says so
    tb.apply(txpg("stray", "nope"), namespace)
    g = wait_until(lambda: (g := tb.get("txpg", "stray", namespace)) and condition(g, "Ready") and g, 30, "stray status")
    assert condition(g, "Ready")["reason"] == "BrokerNotFound"

    # deleting the group removes its settings from the brokers (no finalizer needed)
    tb.kubectl("-n", namespace, "delete", "txpg", "payments")
    wait_until(lambda: all("payments" not in admin(tb.get("pod", p, namespace)).get("/api/v1/groups")
                         for p in ("pgb-0", "pgb-1")), 30, "group settings removed from the brokers")


def test_edited_children_are_put_back(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("mended", replicas=2), namespace)
    wait_broker(operator, namespace, "mended")
    # someone points the master Service at the slaves, loosens the budget and mounts API tokens
    tb.kubectl("-n", namespace, "patch", "service", "mended-master", "--type=merge",
               "-p", '{"spec": {"selector": {"txbroker.dev/role": "slave"}}}')
    tb.kubectl("-n", namespace, "patch", "pdb", "mended", "--type=merge", "-p", '{"spec": {"minAvailable": 0}}')
    tb.kubectl("-n", namespace, "patch", "serviceaccount", "mended-broker", "--type=merge",
               "-p", '{"automountServiceAccountToken": true}')

    wait_until(lambda: tb.get("service", "mended-master", namespace)["spec"]["selector"].get("txbroker.dev/role")
             == "master", 30, "mended-master selecting the master again")
    wait_until(lambda: tb.get("pdb", "mended", namespace)["spec"]["minAvailable"] == 1, 30, "the budget back at 1")
    wait_until(lambda: tb.get("serviceaccount", "mended-broker", namespace)["automountServiceAccountToken"] is False,
             30, "no API token for brokers again")

    def repaired():
        said = [e["message"] for e in events_for(tb, namespace, "mended") if e["reason"] == "Repaired"]
        return len(said) >= 3 and said
    said = wait_until(repaired, 30, "Repaired Events for the three")
    assert any("Service mended-master" in m and "spec.selector" in m for m in said), said
    assert any("PodDisruptionBudget mended" in m for m in said) and any("ServiceAccount mended-broker" in m for m in said)
    wait_until(lambda: service_endpoints(tb, namespace, "mended-master") == addresses(tb, namespace, "mended", 1),
             60, "mended-master's endpoints back on the master")

    # one broker left: no budget to keep
    tb.kubectl("-n", namespace, "patch", "txb", "mended", "--type=merge", "-p", '{"spec": {"replicas": 1}}')
    wait_until(lambda: tb.get("pdb", "mended", namespace) is None, 60, "the PodDisruptionBudget removed")
    wait_until(lambda: tb.get("pod", "mended-1", namespace) is None, 60, "mended-1 removed")
    tb.kubectl("-n", namespace, "delete", "txb", "mended", "--wait=false")


@pytest.mark.slow
def test_failover_under_load_keeps_every_acknowledged_commit(operator):
    tb, namespace = operator.testbed, operator.namespace
    # check-back every second, for up to 5 minutes: the default 15 checks would park (leave
    # undecided) what the failover and a crash-looping fo-0's restarts keep from being answered
    tb.apply(txbroker("fo", replicas=3, replication="SYNC", flush="SYNC",
                      transaction={"checkIntervalSeconds": 1, "timeoutSeconds": 1, "checkMax": 300},
                      failover={"gracePeriodSeconds": 3}), namespace)
    # the load's producer group, its check-back settings in a TxProducerGroup
    tb.apply(txpg("orders-pg", "fo", checkIntervalSeconds=1, timeoutSeconds=1, checkMax=300), namespace)
    wait_broker(operator, namespace, "fo")
    wait_until(lambda: all(b.get("inSync") for b in tb.get("txb", "fo", namespace)["status"]["brokers"]
                         if b["role"] == "slave"), 30, "slaves in sync")
    wait_until(group_applied(tb, namespace, "orders-pg", 1, ["fo-0", "fo-1", "fo-2"]), 30, "orders-pg on every broker")
    everyone = addresses(tb, namespace, "fo", 3)
    # a client that knows only fo-master (operator_env.service_endpoints)
    wait_until(lambda: service_endpoints(tb, namespace, "fo-master") == everyone[:1], 60, "fo-master's endpoint: fo-0")
    svc = MasterServiceClient(tb, namespace, "fo-master", "svc-pg", "ViaService")
    wait_until(lambda: svc.committed_at(everyone[0]) >= 20, 60, "commits through fo-master before the failure")
    ledger, acked, stop = txload.Ledger(), {}, threading.Event()
    loader = threading.Thread(target=txload.run_load, args=(everyone, ledger, acked, stop, 4))
    loader.start()
    try:
        wait_until(lambda: len(acked) >= 100, 60, "load before the failure")

        def crash_until_replaced():
            # SIGKILL the master's process whenever the kubelet restarts it: a crash-looping master
            try:
                tb.kill_pod("fo-0", namespace)
            except LookupError:   # not restarted yet
                pass
            return tb.get("txb", "fo", namespace)["status"]["master"] != "fo-0"
        try:
            wait_until(crash_until_replaced, 60, "the operator to promote a slave", interval=0.1)
        except TimeoutError:
            raise AssertionError("no failover; operator log:\n" + operator.log.read_text()[-5000:])
        txb = wait_until(lambda: (t := tb.get("txb", "fo", namespace)) and condition(t, "FailedOver") and t, 30,
                       "the FailedOver condition")
        new_master = txb["status"]["master"]
        new_address = f"{tb.get('pod', new_master, namespace)['status']['podIP']}:10911"
        assert new_master in ("fo-1", "fo-2") and txb["status"]["epoch"] >= 2
        failed_over = condition(txb, "FailedOver")
        assert failed_over["status"] == "True"
        assert failed_over["lastTransitionTime"] == txb["status"]["lastFailover"]["time"]
        assert txb["status"]["lastFailover"]["from"] == "fo-0"
        assert any(e["reason"] == "FailedOver" and e["type"] == "Warning" for e in events_for(tb, namespace, "fo"))
        assert tb.get("pod", new_master, namespace)["metadata"]["labels"]["txbroker.dev/role"] == "master"
        assert broker_info(tb, namespace, new_master)["role"] == "master"
        # the endpoints follow the new master, and a client reading them again goes on
        wait_until(lambda: service_endpoints(tb, namespace, "fo-master") == [new_address], 60,
                 f"fo-master's endpoint following {new_master}")
        wait_until(lambda: svc.committed_at(new_address) >= 20, 60, "commits through fo-master on the new master")
        before = len(acked)
        wait_until(lambda: len(acked) >= before + 50, 60, "producers to continue on the new master")
        # the group's settings run on the new master at the group's current generation
        g = wait_until(lambda: (g := tb.get("txpg", "orders-pg", namespace)) and any(
            a["name"] == new_master and a["generation"] == g["metadata"]["generation"]
            for a in (g.get("status") or {}).get("applied", [])) and g, 30, "orders-pg applied on the new master")
        assert (g["status"]["appliedGeneration"], g["metadata"]["generation"]) == (1, 1)
    finally:
        stop.set()
        loader.join(60)
        svc.close()

    # the old master comes back as a slave of the new one, and refuses END_TRANSACTION
    old = wait_until(lambda: (p := tb.get("pod", "fo-0", namespace)) and ready(p) and p, 60, "fo-0 back and ready")
    assert old["metadata"]["labels"]["txbroker.dev/role"] == "slave"
    wait_until(lambda: broker_info(tb, namespace, "fo-0")["role"] == "slave", 30, "fo-0 running as a slave")
    # a change to the group after the failover reaches every broker, the returned one too
    tb.kubectl("-n", namespace, "patch", "txpg", "orders-pg", "--type=merge", "-p", '{"spec": {"timeoutSeconds": 2}}')
    wait_until(group_applied(tb, namespace, "orders-pg", 2, ["fo-0", "fo-1", "fo-2"]), 30, "generation 2 everywhere")
    with TransactionProducer("orders-pg", everyone, ledger), \
            TransactionProducer("svc-pg", [new_address], Commit()):   # answer the new master's check-backs
        new_ip = new_address.split(":")[0]
        try:
            wait_until(lambda: txload.settled(f"http://{new_ip}:10912"), 60, "every transaction decided on the new master")
        except TimeoutError:
            raise AssertionError("transactions left undecided on the new master:\n"
                                 + brokers_report(tb, namespace, "fo", 3)) from None
        assert end_transaction_refusal(everyone[0], "orders-pg").code_name == "SLAVE_NOT_AVAILABLE"
    seen = txload.visible(new_address)
    problems = txload.invariant_violations(seen, acked, must_keep_acked=True)
    assert not problems, problems[:5]
    # every commit acknowledged through fo-master, on either side of the failover, kept once
    through = txload.visible(new_address, "ViaService")
    assert {b for _, b in svc.committed} <= set(through) and all(n == 1 for n in through.values())
    wait_until(lambda: tb.get("txb", "fo", namespace)["status"]["phase"] == "Running", 60, "fo Running again")


def roles(tb, namespace: str, pods: list[str]) -> dict[str, tuple[str, int]]:
    """pod -> (role, epoch) as each broker says it now; a broker that does not answer is left out."""
    out = {}
    for name in pods:
        ip = (tb.get("pod", name, namespace) or {}).get("status", {}).get("podIP")
        try:
            info = AdminClient(f"http://{ip}:10912", timeout=1).broker_info()
        except ClientError:
            continue
        out[name] = (info.role, info.epoch)
    return out


@pytest.mark.slow
def test_a_paused_master_that_returns_is_fenced(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("frozen", replicas=2, replication="SYNC", flush="SYNC", failover={"gracePeriodSeconds": 3}),
             namespace)
    wait_broker(operator, namespace, "frozen")
    wait_until(lambda: all(b.get("inSync") for b in tb.get("txb", "frozen", namespace)["status"]["brokers"]
                         if b["role"] == "slave"), 30, "the slave in sync")
    old_address = addresses(tb, namespace, "frozen", 1)[0]
    pods = ["frozen-0", "frozen-1"]
    seen, stop = [], threading.Event()

    def watch():   # who says it is master, at which epoch, all along
        while not stop.is_set():
            seen.append(roles(tb, namespace, pods))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # a long GC pause, a VM freeze: the process is alive but silent past the grace period (and
        # short of its liveness probe's limit, so the kubelet does not restart it)
        tb.kill_pod("frozen-0", namespace, signal.SIGSTOP)
        try:
            wait_until(lambda: tb.get("txb", "frozen", namespace)["status"]["master"] == "frozen-1", 60,
                     "the operator to promote frozen-1")
            wait_until(lambda: broker_info(tb, namespace, "frozen-1")["role"] == "master", 30, "frozen-1 acting as master")
        finally:
            tb.kill_pod("frozen-0", namespace, signal.SIGCONT)
        # back, it still believes it is master at the old epoch, until the operator fences it
        wait_until(lambda: any(e["reason"] == "Fenced" and "frozen-0" in e["message"]
                             for e in events_for(tb, namespace, "frozen")), 60, "a Fenced Event for frozen-0")
        wait_until(lambda: broker_info(tb, namespace, "frozen-0")["role"] == "slave", 30, "frozen-0 demoted")
        refusal = end_transaction_refusal(old_address, "frozen-pg")
        assert refusal.code_name in ("SLAVE_NOT_AVAILABLE", "CONTROLLER_FENCED_MASTER_EPOCH"), refusal
    finally:
        stop.set()
        watcher.join(30)
    txb = tb.get("txb", "frozen", namespace)
    info = broker_info(tb, namespace, "frozen-1")
    assert info["role"] == "master" and info["epoch"] == txb["status"]["epoch"] >= 2
    assert txb["status"]["lastFailover"]["from"] == "frozen-0"
    # two brokers claiming master at different epochs can be seen before the fence; at one epoch, never
    twice = [s for s in seen if len({e for r, e in s.values() if r == "master"})
             < sum(1 for r, _ in s.values() if r == "master")]
    assert not twice, f"two masters at one epoch: {twice[:3]}"
    wait_until(lambda: tb.get("txb", "frozen", namespace)["status"]["phase"] == "Running", 60, "frozen Running again")
    tb.kubectl("-n", namespace, "delete", "txb", "frozen", "--wait=false")


@pytest.mark.slow
def test_scale_roll_and_delete(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("elastic", replicas=2), namespace)
    wait_broker(operator, namespace, "elastic")

    tb.kubectl("-n", namespace, "patch", "txb", "elastic", "--type=merge", "-p", '{"spec": {"replicas": 3}}')
    txb = wait_until(lambda: (t := tb.get("txb", "elastic", namespace))["status"].get("observedGeneration") == 2
                   and t["status"]["phase"] == "Running" and len(t["status"]["brokers"]) == 3 and t, 60, "3 brokers")
    assert broker_info(tb, namespace, "elastic-2")["role"] == "slave"

    # a new image: pods are replaced one at a time, slaves first, the master after a switchover
    uids = {f"elastic-{i}": tb.get("pod", f"elastic-{i}", namespace)["metadata"]["uid"] for i in range(3)}
    master_before = tb.get("txb", "elastic", namespace)["status"]["master"]
    tb.kubectl("-n", namespace, "patch", "txb", "elastic", "--type=merge", "-p", '{"spec": {"image": "txbroker/broker:v2"}}')
    txb, order = wait_rolled(tb, namespace, "elastic", 3, "txbroker/broker:v2", 180, uids)
    assert all(tb.get("pod", n, namespace)["metadata"]["uid"] != uid for n, uid in uids.items())
    # slaves first, highest ordinal first; the pod that was master last
    assert order == sorted(set(uids) - {master_before}, reverse=True) + [master_before], order
    reasons = [e["reason"] for e in sorted(events_for(tb, namespace, "elastic"), key=lambda e: e["lastTimestamp"])]
    assert reasons.count("RollingUpdate") == 3 and "Switchover" in reasons
    assert "Fenced" not in reasons and "FailedOver" not in reasons     # planned: no surprise on the way
    assert txb["status"]["master"] != "elastic-0"      # the master moved before its pod was replaced

    tb.kubectl("-n", namespace, "patch", "txb", "elastic", "--type=merge", "-p", '{"spec": {"replicas": 2}}')
    txb = wait_until(lambda: (t := tb.get("txb", "elastic", namespace))["status"]["phase"] == "Running"
                   and len(t["status"]["brokers"]) == 2 and t, 90, "back to 2 brokers")
    wait_until(lambda: tb.get("pod", "elastic-2", namespace) is None, 60, "elastic-2 gone")
    assert txb["status"]["master"] in ("elastic-0", "elastic-1")

    # deleting the TxBroker takes everything it owns (garbage collection through owner references)
    tb.kubectl("-n", namespace, "delete", "txb", "elastic", "--wait=false")
    owned = [("pod", "elastic-0"), ("pod", "elastic-1"), ("service", "elastic"), ("service", "elastic-master"),
             ("configmap", "elastic-config"), ("serviceaccount", "elastic-broker"), ("pdb", "elastic")]
    wait_until(lambda: all(tb.get(k, n, namespace) is None for k, n in owned), 90, "everything elastic owned gone")


@pytest.mark.slow
def test_operator_killed_mid_roll_finishes_it_after_restart(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("steady", replicas=2), namespace)
    wait_broker(operator, namespace, "steady")
    uids = {f"steady-{i}": tb.get("pod", f"steady-{i}", namespace)["metadata"]["uid"] for i in range(2)}
    tb.kubectl("-n", namespace, "patch", "txb", "steady", "--type=merge", "-p", '{"spec": {"image": "txbroker/broker:v3"}}')
    wait_until(lambda: any(e["reason"] == "RollingUpdate" for e in events_for(tb, namespace, "steady")), 60,
             "the roll to start")
    operator.kill()          # SIGKILL mid-change: nothing in memory survives
    operator.start()
    _, order = wait_rolled(tb, namespace, "steady", 2, "txbroker/broker:v3", 120, uids)
    assert order[-1] == "steady-0", f"the master's pod was not replaced last: {order}"   # across the restart too
    masters = [i for i in range(2) if broker_info(tb, namespace, f"steady-{i}")["role"] == "master"]
    assert len(masters) == 1
    assert tb.get("txb", "steady", namespace)["status"]["master"] == f"steady-{masters[0]}"
