"""Master/slave replication, epoch-fenced role changes, and clients that follow the master (I5, I6)."""

import asyncio
import signal
import threading
from collections import Counter

import pytest

from support.waiting import wait_until
from support import txload
from support.listeners import Decided
from support.txload import Ledger, run_load
from txbroker.client import (
    AsyncTransactionProducer, BrokerError, LocalTransactionState as S, Message, Producer,
    PullConsumer, TransactionListener, TransactionProducer,
)
from txbroker.client.admin import AdminClient, AdminError
from txbroker.client.connection import BrokerClient
from txbroker.protocol.bodies import EndTransactionRequest
from txbroker.protocol.codes import RequestCode, TransactionState

FAST_CHECKS = ("--check-interval-ms", "300", "--transaction-timeout-ms", "200")


def info(b):
    return AdminClient(b.admin_url).get("/api/v1/broker")


def slave_of(factory, master, name, *extra):
    return factory("--role", "slave", "--master", master.address, "--broker-name", name, *FAST_CHECKS, *extra,
                   name=name)


def caught_up(slave, master):
    return lambda: info(slave)["local_durable_offset"] == info(master)["log_end_offset"]


def settled(b):
    return txload.settled(b.admin_url)


def visible(b, topic):
    return txload.visible(b.address, topic)


def test_slave_catches_up_then_follows_live_and_refuses_writes(broker_factory):
    m = broker_factory(*FAST_CHECKS, name="master")
    with Producer("g", m.address) as p:
        for i in range(50):
            p.send(Message("Rep", f"before-{i}".encode()))
    s = slave_of(broker_factory, m, "slave", "--slave-read-enable")
    wait_until(caught_up(s, m), what="the slave to catch up from the log")
    with Producer("g", m.address) as p:
        p.send([Message("Rep", f"after-{i}".encode()) for i in range(20)])
    wait_until(caught_up(s, m), what="live replication")
    with PullConsumer(s.address, require_master=False) as c:
        assert sorted(x.body for x in c.read_all("Rep")) == sorted(
            [f"before-{i}".encode() for i in range(50)] + [f"after-{i}".encode() for i in range(20)])
    status = info(m)["replication"]["slaves"]
    assert [x["name"] for x in status] == ["slave"] and status[0]["lag"] == 0 and status[0]["in_sync"]
    assert info(s)["replication"]["connected"] and info(s)["epoch"] == info(m)["epoch"] == 1


def test_slave_holding_a_pending_transaction_refuses_to_end_it_and_changes_nothing(broker_factory):
    """I5 on a slave that has the half message: END_TRANSACTION there is refused, and neither broker
    commits it, records a decision, or moves its log."""
    m = broker_factory(name="master")
    s = slave_of(broker_factory, m, "slave", "--slave-read-enable")
    with TransactionProducer("pg-rep", m.address, Decided(S.UNKNOWN)) as p:
        r = p.send_message_in_transaction(Message("RepTx", b"half"), None)
    wait_until(caught_up(s, m), what="the slave to hold the half message")
    log_end = info(s)["log_end_offset"]

    async def end_on_slave():
        c = BrokerClient(s.address, require_master=False)
        try:
            await c.request(RequestCode.END_TRANSACTION, EndTransactionRequest(
                "pg-rep", r.transaction_id, TransactionState.COMMIT, r.commit_log_offset))
        finally:
            await c.close()

    with pytest.raises(BrokerError) as e:
        asyncio.run(end_on_slave())
    assert e.value.code_name == "SLAVE_NOT_AVAILABLE"
    for b in (s, m):
        assert AdminClient(b.admin_url).get(f"/api/v1/transactions/{r.transaction_id}")["state"] == "PREPARED"
    assert info(s)["log_end_offset"] == log_end
    with PullConsumer(s.address, require_master=False) as c:
        assert c.read_all("RepTx") == []
    assert not visible(m, "RepTx")


def test_sync_replication_without_slave_rolls_back_without_local_transaction(broker_factory):
    m = broker_factory("--replication-mode", "SYNC", *FAST_CHECKS)
    ran = []

    class L(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            ran.append(msg)
            return S.COMMIT

    with TransactionProducer("pg", m.address, L()) as p:
        r = p.send_message_in_transaction(Message("NoSlave", b"x"), None)
    assert r.send_status == "SLAVE_NOT_AVAILABLE" and r.local_state is S.ROLLBACK and ran == []
    assert visible(m, "NoSlave") == Counter()
    assert AdminClient(m.admin_url).get("/api/v1/transactions")["total"] == 0  # rolled back


def test_stopped_slave_makes_sync_writes_time_out_then_catches_up(broker_factory):
    m = broker_factory("--replication-mode", "SYNC", "--replication-timeout-ms", "500", *FAST_CHECKS, name="master")
    s = slave_of(broker_factory, m, "slave")
    with Producer("g", m.address) as p:
        wait_until(lambda: info(m)["replication"]["slaves"] and info(m)["replication"]["slaves"][0]["in_sync"],
                   what="the slave in sync")
        p.send(Message("Slow", b"ok-1"))
        s.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(BrokerError) as e:
                p.send([Message("Slow", f"while-stopped-{i}".encode()) for i in range(5)])
            assert e.value.code_name == "FLUSH_SLAVE_TIMEOUT" and "stored on the master only" in e.value.remark
        finally:
            s.proc.send_signal(signal.SIGCONT)
        wait_until(caught_up(s, m), what="the resumed slave to catch up")
        assert p.send(Message("Slow", b"ok-2")).msg_ids


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_kill_master_promote_most_caught_up_slave(broker_factory, mode):
    m = broker_factory("--replication-mode", mode, "--flush-disk-type", "SYNC", *FAST_CHECKS, name="master")
    s1 = slave_of(broker_factory, m, "slave1", "--replication-mode", mode, "--flush-disk-type", "SYNC")
    s2 = slave_of(broker_factory, m, "slave2", "--replication-mode", mode, "--flush-disk-type", "SYNC")
    wait_until(lambda: len([x for x in info(m)["replication"]["slaves"] if x["in_sync"]]) == 2, what="both slaves in sync")
    ledger, acked, stop = Ledger(), {}, threading.Event()
    addresses = [m.address, s1.address, s2.address]
    loader = threading.Thread(target=run_load, args=(addresses, ledger, acked, stop))
    loader.start()
    try:
        wait_until(lambda: len(acked) >= 100, 60, what="load before the failure")
        m.kill(signal.SIGKILL)
        # The operator's job, done by the test: promote the most caught-up slave at epoch + 1.
        s_new, s_other = sorted([s1, s2], key=lambda s: info(s)["local_durable_offset"], reverse=True)
        epoch = info(s_new)["epoch"] + 1
        AdminClient(s_new.admin_url).post("/api/v1/role", {"role": "master", "epoch": epoch})
        AdminClient(s_other.admin_url).post("/api/v1/role", {"role": "slave", "master": s_new.address, "epoch": epoch})
        before = len(acked)
        wait_until(lambda: len(acked) >= before + 50, 60, what="producers to continue on the new master")
    finally:
        stop.set()
        loader.join(60)
    assert info(s_new)["role"] == "master" and info(s_new)["epoch"] == epoch
    # Undecided transactions (also those prepared on the old master) are settled by the new master's check-back.
    async def settle():
        async with AsyncTransactionProducer("orders-pg", s_new.address, ledger):
            await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(
                lambda: settled(s_new), 60, what="check-back on the new master, and all of it visible"))
    asyncio.run(settle())
    seen = visible(s_new, "Orders")
    assert all(n == 1 for n in seen.values()), "a message delivered twice"
    assert not [b for b in seen if int(b.split("-")[1]) % 4 == 0], "a rolled-back message is visible"
    lost = {b for b, st in acked.items() if st is S.COMMIT} - set(seen)
    print(f"\n{mode} replication: {len(acked)} acknowledged decisions, {len(lost)} acknowledged commits lost in failover")
    if mode == "SYNC":
        assert lost == set(), f"acknowledged commits lost: {sorted(lost)[:5]}"
    wait_until(caught_up(s_other, s_new), what="the other slave to follow the new master")

    # The deposed master returns with its old data: it must not commit, and it rejoins as a slave.
    m.extra_args = ["--role", "slave", "--master", s_new.address, "--broker-name", "master", *FAST_CHECKS]
    m.start()
    wait_until(caught_up(m, s_new), what="the old master to catch up as a slave")

    async def end_on_old_master():
        c = BrokerClient(m.address, require_master=False)
        try:
            await c.request(RequestCode.END_TRANSACTION, EndTransactionRequest("orders-pg", "t", TransactionState.COMMIT))
        finally:
            await c.close()

    with pytest.raises(BrokerError) as e:
        asyncio.run(end_on_old_master())
    assert e.value.code_name == "SLAVE_NOT_AVAILABLE"
    assert visible(s_new, "Orders") == seen


def test_master_that_sees_a_higher_epoch_is_fenced(broker_factory):
    a = broker_factory(*FAST_CHECKS, name="a")
    b = slave_of(broker_factory, a, "b")
    c = slave_of(broker_factory, a, "c")
    with TransactionProducer("pg", a.address, Ledger()) as p:
        pending = p.send_message_in_transaction(Message("Fence", b"x"), 0)  # i=0: UNKNOWN, pending
    wait_until(caught_up(b, a), what="b caught up")
    wait_until(caught_up(c, a), what="c caught up")
    # b is promoted while a still runs (a network partition, say); c is pointed at the old master.
    AdminClient(b.admin_url).post("/api/v1/role", {"role": "master", "epoch": 2})
    AdminClient(c.admin_url).post("/api/v1/role", {"role": "slave", "master": b.address, "epoch": 2})
    wait_until(lambda: info(c)["epoch"] == 2, what="c to learn epoch 2 from b")
    AdminClient(c.admin_url).post("/api/v1/role", {"role": "slave", "master": a.address, "epoch": 2})
    wait_until(lambda: info(a)["fenced_by"] == 2, what="a to be fenced by c's higher epoch")

    async def end_on(address):
        cl = BrokerClient(address, require_master=False)
        try:
            return await cl.request(RequestCode.END_TRANSACTION, EndTransactionRequest(
                "pg", pending.transaction_id, TransactionState.COMMIT), retry=False)
        finally:
            await cl.close()

    with pytest.raises(BrokerError) as e:
        asyncio.run(end_on(a.address))
    assert e.value.code_name == "CONTROLLER_FENCED_MASTER_EPOCH"
    # The new master holds the transaction prepared on the old one, and commits it.
    asyncio.run(end_on(b.address))
    assert visible(b, "Fence") == Counter({"x": 1})
    with pytest.raises(AdminError, match="epoch above the current 2"):
        AdminClient(c.admin_url).post("/api/v1/role", {"role": "master", "epoch": 2})


def test_group_settings_replicate_and_a_promoted_slave_runs_them(broker_factory):
    """A producer group's settings (what the operator applies from a TxProducerGroup) are log
    records: applied through the master, the slave holds them and refuses to change them itself,
    naming its master; after the master dies, the promoted slave checks the group's transaction back
    at the group's interval with nobody applying the settings again (the broker-wide interval is an
    hour, so nothing else would)."""
    slow = ("--check-interval-ms", "3600000", "--transaction-timeout-ms", "100")
    m = broker_factory(*slow, name="master")
    s = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "slave", *slow, name="slave")
    AdminClient(m.admin_url).put("/api/v1/groups/pg-repl/transaction", {"check_interval_ms": 300, "generation": 5})
    wait_until(lambda: AdminClient(s.admin_url).get("/api/v1/groups").get("pg-repl", {}).get("generation") == 5,
               what="the slave to hold the group's settings")
    assert AdminClient(s.admin_url).get("/api/v1/groups")["pg-repl"]["check_interval_ms"] == 300
    with pytest.raises(AdminError, match=f"slave and changes nothing; the master is {m.address}"):
        AdminClient(s.admin_url).put("/api/v1/groups/pg-repl/transaction", {"check_interval_ms": 1})

    with TransactionProducer("pg-repl", [m.address, s.address], Decided(S.UNKNOWN)) as p:
        p.send_message_in_transaction(Message("TopicRepl", b"r"), None)
        wait_until(caught_up(s, m), what="the slave to hold the half message")
        m.kill(signal.SIGKILL)
        p.listener = Decided(S.COMMIT)
        AdminClient(s.admin_url).post("/api/v1/role", {"role": "master", "epoch": info(s)["epoch"] + 1})
        p.send_message_in_transaction(Message("TopicRepl", b"after"), None)  # the producer is on the new master
        wait_until(lambda: visible(s, "TopicRepl") == {"r": 1, "after": 1}, 30,
                   what="the promoted slave to check the transaction back at the group's interval")
    assert AdminClient(s.admin_url).get("/api/v1/groups")["pg-repl"]["generation"] == 5


def test_a_slave_serves_only_what_its_master_published(broker_factory):
    """Second review, suspected and reproduced: with --slave-read-enable and --sync-replicas 2, a
    slave served records its master had not published (the other slave lacked them), which a
    failover to that other slave takes away. A slave serves up to its master's published offset."""
    flags = ("--replication-mode", "SYNC", "--sync-replicas", "2", "--replication-timeout-ms", "300",
             "--replication-heartbeat-ms", "100", "--slave-read-enable")
    m = broker_factory(*flags, name="master")
    s1, s2 = (slave_of(broker_factory, m, name, *flags) for name in ("s1", "s2"))
    wait_until(lambda: sum(x["in_sync"] for x in info(m)["replication"]["slaves"]) == 2, what="both slaves in sync")
    with Producer("g", m.address) as p:
        p.send(Message("Read", b"published"))
        s2.kill()
        with pytest.raises(BrokerError) as e:
            p.send(Message("Read", b"only on s1"))
        assert e.value.code_name in ("SLAVE_NOT_AVAILABLE", "FLUSH_SLAVE_TIMEOUT")
    wait_until(caught_up(s1, m), what="s1 to hold the unpublished record")
    with PullConsumer(s1.address, require_master=False) as c:
        assert [x.body for x in c.read_all("Read")] == [b"published"]
