"""What SUCCESS means under SYNC replication, as a user checks it: an acknowledged write survives the
loss of the master, a write the broker could not replicate is neither acknowledged (not even on a
retry) nor visible to consumers until a slave has it, and a restart does not change that."""

import asyncio
import random
import signal
import threading
from pathlib import Path

import msgspec
import pytest

from support.brokers import free_port
from support.cli import run_cli
from support.waiting import wait_until
from support import txload
from txbroker.client import (
    AsyncTransactionProducer, BrokerError, BrokerUnavailable, ConsumeStatus, LocalTransactionState as S, Message, Producer, PullConsumer,
    PushConsumer,
)
from txbroker.client.admin import AdminClient, AdminError
from txbroker.protocol import admin as answers
from txbroker_operator import failover, status
from txbroker_operator.brokers import BrokerInfo
from txbroker_operator.observe import Member

SYNC = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-timeout-ms", "1000",
        "--check-interval-ms", "60000")


CONSUMER = dict(heartbeat_interval=0.5, rebalance_interval=1.0, offset_commit_interval=0.2, long_poll_ms=300)


def info(b):
    return AdminClient(b.admin_url).get("/api/v1/broker")


def in_sync(master) -> int:
    return sum(1 for s in info(master)["replication"]["slaves"] if s["in_sync"])


def pair(broker_factory):
    m = broker_factory(*SYNC, name="master")
    s = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "slave", *SYNC, name="slave")
    wait_until(lambda: in_sync(m) == 1, what="the slave in sync")
    return m, s


def promote(slave, epoch=2):
    AdminClient(slave.admin_url).post("/api/v1/role", {"role": "master", "epoch": epoch})


def transaction(b, txid):
    try:
        return AdminClient(b.admin_url).get(f"/api/v1/transactions/{txid}")
    except AdminError as e:
        if e.status == 404:
            return None
        raise


def refused(coro) -> str:
    try:
        asyncio.run(coro)
    except BrokerError as e:
        return e.code_name
    return "SUCCESS"


def test_retried_half_send_is_not_acknowledged_until_a_slave_has_it(broker_factory):
    """Issue 23, defect 1: the retry of a half send refused SLAVE_NOT_AVAILABLE was answered SUCCESS
    (duplicate) with no slave up, and the transaction was gone after failover."""
    m, s = pair(broker_factory)
    s.kill()
    wait_until(lambda: in_sync(m) == 0, what="the master to see its slave gone")

    async def prepare():
        async with AsyncTransactionProducer("pg-dur", m.address, None) as p:
            await p.prepare([Message("Dur", b"half")], "tx-retried")

    assert refused(prepare()) == "SLAVE_NOT_AVAILABLE"
    # The retry `prepare` documents as safe: still not replicated, so still not acknowledged.
    assert refused(prepare()) == "SLAVE_NOT_AVAILABLE"

    s.start()  # the slave comes back and catches up; now the retry is acknowledged, and means it
    wait_until(lambda: in_sync(m) == 1, what="the slave back in sync")
    assert refused(prepare()) == "SUCCESS"
    m.kill()
    s.kill()
    s.start()
    promote(s)
    assert transaction(s, "tx-retried") is not None, "an acknowledged half message was lost in failover"


def test_retried_commit_is_not_acknowledged_until_a_slave_has_it(broker_factory):
    """The same for END_TRANSACTION: a duplicate commit is acknowledged only once the commit is replicated;
    until then consumers do not see it."""
    m, s = pair(broker_factory)

    async def prepare():
        async with AsyncTransactionProducer("pg-dur", m.address, None) as p:
            return await p.prepare([Message("DurEnd", b"to-commit")], "tx-end")

    asyncio.run(prepare())
    s.kill()
    wait_until(lambda: in_sync(m) == 0, what="the master to see its slave gone")

    async def commit():
        async with AsyncTransactionProducer("pg-dur", m.address, None) as p:
            await p.end("tx-end", S.COMMIT)

    assert refused(commit()) == "SLAVE_NOT_AVAILABLE"
    assert refused(commit()) == "SLAVE_NOT_AVAILABLE"
    assert txload.visible(m.address, "DurEnd") == {}, "a commit no slave has is visible on the master"
    s.start()
    wait_until(lambda: txload.visible(m.address, "DurEnd") == {"to-commit": 1},
               what="the commit to become visible once the slave has it")
    assert refused(commit()) == "SUCCESS"
    m.kill()
    promote(s)
    assert txload.visible(s.address, "DurEnd") == {"to-commit": 1}


def test_unreplicated_send_stays_invisible_across_a_master_restart(broker_factory):
    """Consumers see only what a failover keeps (Kafka's high watermark): a send refused
    SLAVE_NOT_AVAILABLE is not readable on the master, not after a kill -9 and restart either,
    and becomes readable once a slave has it."""
    m, s = pair(broker_factory)
    with Producer("g", m.address) as p:
        p.send(Message("Hw", b"replicated"))
        s.kill()
        wait_until(lambda: in_sync(m) == 0, what="the master to see its slave gone")
        with pytest.raises(BrokerError) as e:
            p.send(Message("Hw", b"master-only"))
        assert e.value.code_name == "SLAVE_NOT_AVAILABLE"
    assert txload.visible(m.address, "Hw") == {"replicated": 1}
    m.kill(signal.SIGKILL)
    m.start()
    # restarted, it serves nothing until a slave shows its log whole (seed 450): not the unreplicated send either
    with pytest.raises(BrokerError, match="lost nothing"):
        txload.visible(m.address, "Hw")
    s.start()
    wait_until(lambda: txload.visible(m.address, "Hw") == {"replicated": 1, "master-only": 1},
               what="the send to become visible once the slave has it")


def test_consumer_after_an_unclean_failover_skips_nothing_the_new_master_acknowledges(broker_factory):
    """Issue 23, suspected: after an unclean failover a consumer resumes at offsets the new master
    reuses for other messages, and skips them. (With master-only writes readable, the consumer read
    them, moved past them, and then skipped the new master's messages at those offsets.)"""
    m, s = pair(broker_factory)
    run_cli("topic", "create", "Reuse", "--queues", "1", "--admin", m.admin_url)
    wait_until(lambda: info(s)["local_durable_offset"] == info(m)["log_end_offset"], what="the topic on the slave")
    got, lock = [], threading.Lock()

    def listener(msgs, ctx):
        with lock:
            got.extend(x.body.decode() for x in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    def caught_up_with_readable():
        with PullConsumer(m.address) as c:
            committed, ends = c.committed_offsets("reuse-cg", "Reuse")
        return committed.get(0) == ends.get(0)

    with PushConsumer("reuse-cg", [m.address, s.address], "Reuse", listener, **CONSUMER):
        with Producer("g", m.address) as p:
            for i in range(5):
                p.send(Message("Reuse", f"a-{i}".encode()))
            wait_until(lambda: len(got) == 5, what="the replicated messages consumed")
            # committed while the slave holds it: an offset commit the slave lacks is not read
            wait_until(caught_up_with_readable, what="the group's offset at the end of what it can read")
            s.kill()
            wait_until(lambda: in_sync(m) == 0, what="the master to see its slave gone")
            for i in range(5):
                with pytest.raises(BrokerError):
                    p.send(Message("Reuse", f"master-only-{i}".encode()))
        m.kill()
        s.start()
        promote(s)
        m.extra_args = ["--role", "slave", "--master", s.address, "--broker-name", "master", *SYNC]
        m.start()  # the old master rejoins as a slave (dropping what it alone had): SYNC writes go on
        wait_until(lambda: in_sync(s) == 1, what="the old master in sync as a slave")
        with Producer("g", s.address) as p:
            for i in range(5):
                p.send(Message("Reuse", f"n-{i}".encode()))
        wait_until(lambda: {f"n-{i}" for i in range(5)} <= set(got), 30,
                   what="every message the new master acknowledged to reach the consumer")
    assert not [x for x in got if x.startswith("master-only")], "a message no slave had was consumed"


def _as_member(name: str, index: int, b, role: str = "slave") -> Member:
    """The operator's view of one broker: its admin API's answer (None: it does not answer), and
    its pod's role label."""
    try:
        seen = BrokerInfo.from_api(msgspec.convert(info(b), answers.BrokerInfo))
    except BrokerUnavailable:
        seen = None
    pod = {"metadata": {"name": name, "labels": {"txbroker.dev/index": str(index), "txbroker.dev/role": role}},
           "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": str(seen is not None)}]}}
    return Member(name, index, pod, seen)


DURABLE_PAIR = {"replication": "SYNC", "flush": "SYNC", "storage": {"size": "1Gi"}, "replicas": 2}  # as SYNC's brokers


def _damage(store: Path) -> None:
    """A failing disk: bits flipped in the store's tables and log."""
    rnd = random.Random(274)
    for f in sorted(p for p in store.rglob("*") if p.suffix in (".sst", ".log") and p.stat().st_size > 64):
        with open(f, "r+b") as out:
            for at in sorted(rnd.randrange(f.stat().st_size) for _ in range(8)):
                out.seek(at)
                byte = out.read(1)[0]
                out.seek(at)
                out.write(bytes([byte ^ 0x10]))


def test_a_group_of_two_whose_new_master_is_lost_before_the_old_one_follows_it_fails_back(broker_factory):
    """The fault harness, seed 274: a group of two brokers. Its master b0 is killed and b1 promoted at
    epoch 2; b1 is lost (its store damaged) before b0, restarted as a slave, has followed it. No slave
    was ever in sync with b1, so nothing at epoch 2 was acknowledged, and b0 holds every write
    acknowledged before: the operator's decision promotes it (it left the group without a master,
    for good). Every acknowledged message is there, new sends are acknowledged, and b1 comes back as
    b0's slave."""
    m, s = pair(broker_factory)
    with Producer("g", m.address) as p:
        for i in range(20):
            p.send(Message("Two", f"acked-{i}".encode()))
    entries = status.broker_entries({"b0": _as_member("b0", 0, m, "master"), "b1": _as_member("b1", 1, s)}, "b0", [])
    m.kill()
    promote(s)
    with Producer("g", s.address) as p:   # b1 alone at epoch 2 acknowledges nothing
        with pytest.raises(BrokerError) as refused_send:
            p.send(Message("Two", b"epoch-2-only"))
    assert refused_send.value.code_name in ("SLAVE_NOT_AVAILABLE", "FLUSH_SLAVE_TIMEOUT")
    entries = status.broker_entries({"b0": _as_member("b0", 0, m), "b1": _as_member("b1", 1, s, "master")}, "b1",
                                    entries)
    s.kill()
    _damage(s.data_dir)
    m.extra_args = ["--role", "slave", "--master", s.address, "--broker-name", "master", *SYNC]
    m.start()
    members = {"b0": _as_member("b0", 0, m), "b1": _as_member("b1", 1, s, "master")}
    entries = status.broker_entries(members, "b1", entries)
    decision = failover.decide_failover(DURABLE_PAIR, {"epoch": 2, "master": "b1", "brokers": entries}, members, "b1", 30)
    assert isinstance(decision, failover.Promote), decision
    assert decision.successor == "b0" and decision.epoch == 3
    promote(m, decision.epoch)
    s.extra_args = ["--role", "slave", "--master", m.address, "--broker-name", "slave", *SYNC]
    s.start()
    wait_until(lambda: in_sync(m) == 1, 30, what="b1 back, as b0's slave, in sync")
    with Producer("g", m.address) as p:
        p.send(Message("Two", b"after"))
    assert txload.visible(m.address, "Two") == {**{f"acked-{i}": 1 for i in range(20)}, "after": 1}


def test_a_slave_in_sync_whose_pod_is_deleted_is_waited_for_not_forgotten(broker_factory):
    """A review of the rule above, on real brokers: b2 in sync holds every acknowledged write, b1
    answers but is cut off (not in sync). b0 crashes and b2's pod is deleted (a drain): its status
    entry goes with it, and once its pod is gone it is no member. Counting only what was left,
    failover promoted b1, which lacked all 20 acknowledged writes; the group is counted by replicas."""
    m = broker_factory(*SYNC, name="b0")
    s2 = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "b2", *SYNC, name="b2")
    s1 = broker_factory("--role", "slave", "--master", f"127.0.0.1:{free_port()}", "--broker-name", "b1", *SYNC,
                        name="b1")
    wait_until(lambda: in_sync(m) == 1, what="b2 in sync")
    with Producer("g", m.address) as p:
        for i in range(20):
            p.send(Message("Acked", f"acked-{i}".encode()))
    entries = status.broker_entries({"b0": _as_member("b0", 0, m, "master"), "b1": _as_member("b1", 1, s1),
                                     "b2": _as_member("b2", 2, s2)}, "b0", [])
    assert [e.get("promotable") for e in entries if e["name"] != "b0"] == [False, True]
    m.kill()
    s2.stop()
    deleting = _as_member("b2", 2, s2)
    deleting.pod["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    members = {"b0": _as_member("b0", 0, m, "master"), "b1": _as_member("b1", 1, s1), "b2": deleting}
    spec = {**DURABLE_PAIR, "replicas": 3}
    assert isinstance(failover.decide_failover(spec, {"epoch": 1, "master": "b0", "brokers": entries}, members, "b0",
                                               30), failover.Blocked)
    entries = status.broker_entries(members, "b0", entries)
    assert "b2" not in [e["name"] for e in entries]     # what made it forgotten
    members = {"b0": _as_member("b0", 0, m, "master"), "b1": _as_member("b1", 1, s1)}   # b2's pod gone
    d = failover.decide_failover(spec, {"epoch": 1, "master": "b0", "brokers": entries}, members, "b0", 30)
    assert isinstance(d, failover.Blocked) and d.reason == "NoInSyncSlave", d
    s2.start()   # its pod recreated on its volume: b2 answers, and is promoted
    members["b2"] = _as_member("b2", 2, s2)
    entries = status.broker_entries(members, "b0", entries)
    d = failover.decide_failover(spec, {"epoch": 1, "master": "b0", "brokers": entries}, members, "b0", 30)
    assert isinstance(d, failover.Promote) and d.successor == "b2", d
    promote(s2, d.epoch)
    assert txload.visible(s2.address, "Acked") == {f"acked-{i}": 1 for i in range(20)}
