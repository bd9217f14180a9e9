"""kill -9 under concurrent transactional load with SYNC flush (I1-I4, I6 on one broker).

Producers record what the broker acknowledged. After the broker is killed and restarted on its
data, every acknowledged commit is visible exactly once, no rolled-back or undecided message is,
and check-back settles the rest from the producers' own record of their decisions.
"""

import asyncio
import signal
import threading
from collections import Counter

import pytest

from support.waiting import wait_until
from support.listeners import Decided
from txbroker.client import (
    AsyncTransactionProducer, ClientError, LocalTransactionState as S, Message, PullConsumer, TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient

TOPIC = "Orders"


class Ledger(TransactionListener):
    """The producers' local transactions: each order's decision, kept as a local database would."""

    def __init__(self):
        self.decisions: dict[str, S] = {}
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg, arg):
        i = arg
        msg = msg[0] if isinstance(msg, list) else msg
        decision = S.ROLLBACK if i % 4 == 0 else S.COMMIT
        with self.lock:
            self.decisions[msg.transaction_id] = decision
        return S.UNKNOWN if i % 5 == 0 else decision  # some leave the decision to check-back

    def check_local_transaction(self, msg):
        with self.lock:
            return self.decisions.get(msg.transaction_id, S.ROLLBACK)


async def load(address: str, ledger: Ledger, stop_after: threading.Event, acked: dict, producers: int = 8):
    async def one(worker: int):
        p = AsyncTransactionProducer("orders-pg", address, ledger, request_timeout=2)
        await p.start()
        i = worker
        try:
            while True:
                # 1 to 3 messages per transaction: a commit indexes them as one run of offsets
                bodies = [f"order-{i}-{j}" for j in range(1 + i % 3)]
                msgs = [Message(TOPIC, b.encode()) for b in bodies]
                try:
                    r = await p.send_message_in_transaction(msgs if len(msgs) > 1 else msgs[0], i)
                except ClientError:
                    return  # the broker is gone
                if r.local_state is not S.UNKNOWN and not r.end_error:
                    for body in bodies:
                        acked[body] = (r.transaction_id, r.local_state)
                if r.end_error:
                    return
                i += producers
                if i > 40 * producers:
                    stop_after.set()
        finally:
            await p.close()

    await asyncio.gather(*(one(w) for w in range(producers)))


@pytest.mark.slow
def test_kill_9_loses_no_acknowledged_commit(broker_factory):
    b = broker_factory("--flush-disk-type", "SYNC", "--check-interval-ms", "300", "--transaction-timeout-ms", "200")
    ledger = Ledger()
    acked: dict[str, tuple] = {}
    warmed = threading.Event()
    loader = threading.Thread(target=lambda: asyncio.run(load(b.address, ledger, warmed, acked)))
    loader.start()
    assert warmed.wait(60), "load did not get going"
    b.kill(signal.SIGKILL)  # mid-traffic
    loader.join(60)
    assert not loader.is_alive()
    assert acked, "some transactions must have been acknowledged before the kill"

    b.start()  # same data dir
    admin = AdminClient(b.admin_url)

    async def settle():
        # The producers' group comes back to answer check-backs from their record of decisions.
        async with AsyncTransactionProducer("orders-pg", b.address, ledger):
            await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(
                lambda: admin.get("/api/v1/transactions")["total"] == 0
                and admin.get("/api/v1/broker")["durable_offset"] == admin.get("/api/v1/broker")["log_end_offset"],
                30, what="check-back to settle all, durably"))

    asyncio.run(settle())
    with PullConsumer(b.address) as c:
        seen = Counter(m.body.decode() for m in c.read_all(TOPIC))
    assert all(n == 1 for n in seen.values()), f"delivered twice: {[k for k, n in seen.items() if n > 1]}"
    by_order = Counter(body.rsplit("-", 1)[0] for body in seen)  # a transaction is visible whole or not at all
    assert all(n == 1 + int(order.split("-")[1]) % 3 for order, n in by_order.items()), by_order
    committed_acked = {body for body, (_t, s) in acked.items() if s is S.COMMIT}
    assert committed_acked <= set(seen), f"lost acknowledged commits: {sorted(committed_acked - set(seen))[:5]}"
    # Nothing visible that its producer did not decide to commit (rollbacks and undecided: never).
    for body in seen:
        i = int(body.split("-")[1])
        assert i % 4 != 0, f"{body} was rolled back but is visible"
    assert b.log().count("recovered store") == 2


def test_sigterm_stops_cleanly_and_a_restart_finds_everything(broker_factory):
    """A graceful stop: exit 0, said in the log, and the restarted broker holds the same committed
    messages and the same undecided transactions, and says how many it recovered."""
    b = broker_factory("--check-interval-ms", "3600000", "--transaction-timeout-ms", "3600000")
    with TransactionProducer("pg-stop", b.address, Decided(S.COMMIT)) as p:
        for i in range(3):
            p.send_message_in_transaction(Message(TOPIC, f"c{i}".encode()), None)
        p.listener = Decided(S.UNKNOWN)
        undecided = {p.send_message_in_transaction(Message(TOPIC, f"u{i}".encode()), None).transaction_id
                     for i in range(2)}
    assert b.stop() == 0
    assert "stopped" in b.log()
    b.start()
    assert "2 pending transactions" in b.log().rsplit("recovered store", 1)[1]
    admin = AdminClient(b.admin_url)
    assert {t["transaction_id"] for t in admin.get("/api/v1/transactions")["transactions"]} == undecided
    with PullConsumer(b.address) as c:
        assert sorted(m.body for m in c.read_all(TOPIC)) == [b"c0", b"c1", b"c2"]
    for txid in undecided:
        admin.post(f"/api/v1/transactions/{txid}/commit")
    with PullConsumer(b.address) as c:
        assert sorted(m.body for m in c.read_all(TOPIC)) == [b"c0", b"c1", b"c2", b"u0", b"u1"]
