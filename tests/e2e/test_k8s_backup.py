"""Backup and restore on the real node (issue 32, item 4): `txbroker backup create` in a pod, against
a slave of a running TxBroker, writes the group's backup to a volume; a new TxBroker with
spec.restore starts from it: its master restores in an init container, and everything comes back
(committed messages, pending transactions checked back, a parked one, an undecided job, consumer
offsets), its slave copies the restored master. The refusals, each a condition or a failed pod
naming why, with nothing lost: a backup asked of the master; spec.restore on a running TxBroker;
a restore onto a TxBroker whose volumes hold a store already. One test: each step needs the last."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest
from support import txload
from support.listeners import CommitOnCheck
from support.waiting import wait_until
from operator_env import IMAGE, admin, condition, events_for, finished, start_operator, txbroker, wait_broker
from txbroker.client import AsyncTransactionProducer, JobCoordinator, Message, Producer, PullConsumer

pytestmark = pytest.mark.e2e

CLAIM = "backups"


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-backup-{worker_id}")


def ip(tb, namespace: str, pod: str) -> str:
    return tb.get("pod", pod, namespace)["status"]["podIP"]


def backup_claim() -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}


def cli_pod(name: str, *args: str, claim: str = CLAIM, mount: str = "/backups") -> dict:
    """The txbroker command in a pod of the broker's image, the claim mounted (as a user runs a backup)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never",
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001},
                     "containers": [{"name": "main", "image": IMAGE, "args": list(args),
                                     "volumeMounts": [{"name": "v", "mountPath": mount}]}],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}}


def run_pod(tb, namespace: str, pod: dict, timeout: float = 180) -> tuple[str, str]:
    """(phase, log) of a pod run to its end."""
    tb.apply(pod, namespace)
    name = pod["metadata"]["name"]
    p = wait_until(lambda: finished(tb, namespace, name), timeout, f"pod {name} to finish")
    return p["status"]["phase"], tb.logs(name, namespace)


def transactions(url: str) -> dict[str, str]:
    from txbroker.client.admin import AdminClient
    return {t.transaction_id: t.state for t in AdminClient(url).transactions().transactions}


def prepare(address: str, group: str, txid: str, body: bytes) -> None:
    async def go():
        async with AsyncTransactionProducer(group, address, None) as p:
            await p.prepare([Message("Kept", body)], txid)
    asyncio.run(go())


def test_a_backup_of_a_slave_restores_into_a_new_txbroker_with_everything_in_it(operator):
    tb, ns = operator.testbed, operator.namespace
    tb.apply(txbroker("src", replicas=2, replication="SYNC", flush="SYNC"), ns)
    wait_broker(operator, ns, "src")
    wait_until(lambda: all(b.get("inSync") for b in tb.get("txb", "src", ns)["status"]["brokers"]
                           if b["role"] == "slave"), 60, "src's slave in sync")
    m_ip, s_ip = ip(tb, ns, "src-0"), ip(tb, ns, "src-1")
    m_url = f"http://{m_ip}:10912"
    m = admin(tb.get("pod", "src-0", ns))

    # what must come back: a parked transaction, a pending one, an open job with a member, a
    # consumer group's offset, and the commits of a transactional load
    m.put("/api/v1/groups/park-pg/transaction", {"check_max": 1, "timeout_ms": 1, "check_interval_ms": 200})
    prepare(f"{m_ip}:10911", "park-pg", "to-park", b"parked-body")
    wait_until(lambda: transactions(m_url).get("to-park") == "PARKED", 30, "to-park parked")
    prepare(f"{m_ip}:10911", "kept-pg", "stays-pending", b"pending-body")
    with JobCoordinator("job-pg", f"{m_ip}:10911") as c:
        job = c.open(timeout=3600)
        member = c.send(job.job_id, Message("Kept", b"job-body"))
    with Producer("p", f"{m_ip}:10911") as p:
        for i in range(3):
            p.send(Message("Billing", f"bill-{i}".encode(), queue_id=0))
    with PullConsumer(f"{m_ip}:10911") as c:
        c.commit_offsets("billing", {("Billing", 0): 2})
    ledger, acked, stop = txload.Ledger(), {}, threading.Event()
    load = threading.Thread(target=txload.run_load, args=([f"{m_ip}:10911"], ledger, acked, stop, 3))
    load.start()
    try:
        wait_until(lambda: len(acked) >= 60, 60, "the load")
    finally:
        stop.set()
        load.join(60)
    assert not load.is_alive()
    end = m.get("/api/v1/broker")["log_end_offset"]
    wait_until(lambda: admin(tb.get("pod", "src-1", ns)).get("/api/v1/broker")["local_durable_offset"] >= end, 30,
               "the slave holding the load")

    # the backup: of the master, refused; of the slave, into the claim
    tb.apply(backup_claim(), ns)
    phase, log = run_pod(tb, ns, cli_pod("backup-master", "backup", "create", "--admin", m_url,
                                         "--to", "/backups/refused"))
    assert phase == "Failed" and "is the master of its group" in log and "src-1" in log, log
    phase, log = run_pod(tb, ns, cli_pod("backup", "backup", "create", "--admin", f"http://{s_ip}:10912",
                                         "--to", "/backups/nightly/g0"))
    assert phase == "Succeeded" and "backup of src-1 written to /backups/nightly/g0" in log, log
    phase, log = run_pod(tb, ns, cli_pod("verify", "backup", "verify", "--from", "/backups/nightly/g0"))
    assert phase == "Succeeded" and "is whole" in log, log

    # spec.restore on the running TxBroker: refused, nothing restarted
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in tb.list("pods", ns, "txbroker.dev/broker=src")}
    tb.kubectl("-n", ns, "patch", "txb", "src", "--type=merge", "-p",
               '{"spec": {"restore": {"claimName": "backups", "path": "nightly/{group}"}}}')
    # (status.restore is written as decided, the conditions at the end of that pass)
    txb = wait_until(lambda: (t := tb.get("txb", "src", ns)) and (t["status"].get("restore") or {}).get("phase")
                     == "Refused" and condition(t, "Restored") and t, 60, "spec.restore refused on src")
    assert condition(txb, "Restored")["reason"] == "RestoreRefused"
    assert any(e["reason"] == "RestoreRefused" and "already runs brokers" in e["message"]
               for e in events_for(tb, ns, "src"))
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in tb.list("pods", ns, "txbroker.dev/broker=src")} == uids

    # a new TxBroker from the backup
    tb.apply(txbroker("dst", replicas=2, replication="SYNC", flush="SYNC",
                      # checked every second, and not parked before this test's producers answer
                      transaction={"checkIntervalSeconds": 1, "timeoutSeconds": 1, "checkMax": 1000},
                      restore={"claimName": CLAIM, "path": "nightly/{group}"}), ns)
    wait_broker(operator, ns, "dst", timeout=180)
    txb = wait_until(lambda: (t := tb.get("txb", "dst", ns)) and (t["status"].get("restore") or {}).get("phase")
                     == "Restored" and condition(t, "Restored") and t, 60, "dst restored")
    assert condition(txb, "Restored")["status"] == "True"
    assert "restore" in [c["name"] for c in tb.get("pod", "dst-0", ns)["spec"]["initContainers"]]
    assert "restored backup src-1-" in tb.logs("dst-0", ns, container="restore")
    d_ip = ip(tb, ns, "dst-0")
    d_url, d_addr = f"http://{d_ip}:10912", f"{d_ip}:10911"
    held = transactions(d_url)
    assert (held["to-park"], held[member]) == ("PARKED", "PREPARED")
    assert admin(tb.get("pod", "dst-0", ns)).job(job.job_id).state == "OPEN"
    with PullConsumer(d_addr) as c:
        assert c.committed_offsets("billing", "Billing")[0] == {0: 2}
    # check-back on the restored master ends what was pending, from the producers' answers
    async def settle():
        async with AsyncTransactionProducer("orders-pg", d_addr, ledger), \
                AsyncTransactionProducer("kept-pg", d_addr, CommitOnCheck()):
            await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(
                lambda: set(transactions(d_url)) == {"to-park", member}, 120, "dst's pending transactions checked back"))
    asyncio.run(settle())
    with JobCoordinator("job-pg", d_addr) as c:
        c.commit(job.job_id, [member])
    wait_until(lambda: txload.visible(d_addr, "Kept") == Counter({"pending-body": 1, "job-body": 1}), 60,
               "the decided ones visible")
    problems = txload.invariant_violations(txload.visible(d_addr), acked, must_keep_acked=True)
    assert not problems, problems[:10]
    # the restored master's slave copies it
    wait_until(lambda: all(b.get("inSync") for b in tb.get("txb", "dst", ns)["status"]["brokers"]
                           if b["role"] == "slave"), 120, "dst's slave in sync with the restored master")

    # (in this test: the restore below needs this backup, and a module's tests may run on different workers)
    restore_onto_a_used_volume_is_refused_and_keeps_it(operator)


def restore_onto_a_used_volume_is_refused_and_keeps_it(operator) -> None:
    """A TxBroker deleted keeps its claims; one of the same name made from a backup finds its
    master's claim holding the old store: the restore step refuses it, the broker never starts, and
    the old store is whole (a TxBroker without spec.restore serves it again)."""
    tb, ns = operator.testbed, operator.namespace
    tb.apply(txbroker("old", replicas=1, storage={"size": "1Gi"}), ns)
    wait_broker(operator, ns, "old")
    o_ip = ip(tb, ns, "old-0")
    with Producer("p", f"{o_ip}:10911") as p:
        p.send(Message("Orders", b"kept"))
    tb.kubectl("-n", ns, "delete", "txb", "old", "--wait=true")
    wait_until(lambda: not tb.list("pods", ns, "txbroker.dev/broker=old"), 120, "old's pods gone (its claim stays)")
    # the same name again, from a backup: its claim data-old-0 holds the old store
    tb.apply(txbroker("old", replicas=1, storage={"size": "1Gi"},
                      restore={"claimName": CLAIM, "path": "nightly/{group}"}), ns)
    txb = wait_until(lambda: (t := tb.get("txb", "old", ns)) and (cond := condition(t, "Restored")) and
                     cond["reason"] == "RestoreRefused" and t, 180, "the restore step's refusal reported")
    message = condition(txb, "Restored")["message"]
    assert "data directory /data is not empty" in message and "nothing was changed" in message, message
    assert any(e["reason"] == "RestoreRefused" and "is not empty" in e["message"] for e in events_for(tb, ns, "old"))
    pod = tb.get("pod", "old-0", ns)
    assert not any(s.get("ready") for s in pod["status"].get("containerStatuses") or [])   # the broker never started
    # the old store is whole: a broker on that claim (restore removed) still serves its message
    tb.kubectl("-n", ns, "delete", "txb", "old", "--wait=true")
    wait_until(lambda: not tb.list("pods", ns, "txbroker.dev/broker=old"), 120, "old's pods gone again")
    tb.apply(txbroker("old", replicas=1, storage={"size": "1Gi"}), ns)
    wait_broker(operator, ns, "old")
    assert txload.visible(f"{ip(tb, ns, 'old-0')}:10911") == Counter({"kept": 1})
