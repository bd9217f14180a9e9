"""Transactional load with known decisions, and the checks of invariants I1-I3 on what is visible.

Used by the replication tests (brokers as local processes) and the operator's failover test (brokers
as pods on the Kubernetes testbed).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

from txbroker.client import (
    AsyncTransactionProducer, ClientError, LocalTransactionState as S, Message, PullConsumer, TransactionListener,
)
from txbroker.client.admin import AdminClient


class Ledger(TransactionListener):
    """Decision per order: ROLLBACK if i % 4 == 0, else COMMIT; every fifth leaves it to check-back."""

    def __init__(self):
        self.decisions = {}
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg, i):
        d = S.ROLLBACK if i % 4 == 0 else S.COMMIT
        with self.lock:
            self.decisions[msg.transaction_id] = d
        return S.UNKNOWN if i % 5 == 0 else d

    def check_local_transaction(self, msg):
        with self.lock:
            return self.decisions.get(msg.transaction_id, S.ROLLBACK)


def run_load(addresses, ledger, acked, stop, producers=6, group="orders-pg", topic="Orders", failed=None):
    """Send `order-<i>` transactions until `stop` is set; `acked[body]` = the decision the broker
    acknowledged (commits and rollbacks whose END_TRANSACTION was answered). `failed`, a list: each
    client-visible failure (a transaction that raised, or whose END was not answered), as text."""
    async def one(w):
        p = AsyncTransactionProducer(group, addresses, ledger, request_timeout=8)
        await p.start()
        i = w
        try:
            while not stop.is_set():
                try:
                    r = await p.send_message_in_transaction(Message(topic, f"order-{i}".encode()), i)
                except ClientError as e:
                    if failed is not None:
                        failed.append(f"order-{i}: {e}")
                    i += producers
                    continue
                if r.local_state is not S.UNKNOWN and not r.end_error:
                    acked[f"order-{i}"] = r.local_state
                if failed is not None and (r.end_error or r.send_status != "SEND_OK"):
                    failed.append(f"order-{i}: " + (f"END_TRANSACTION: {r.end_error}" if r.end_error else
                                                    f"half message {r.send_status}: rolled back"))
                i += producers
        finally:
            await p.close()

    async def main():
        await asyncio.gather(*(one(w) for w in range(producers)))

    asyncio.run(main())


def visible(address, topic="Orders") -> Counter:
    """How often each body is visible in `topic` on the broker at `address`."""
    with PullConsumer(address) as c:
        return Counter(m.body.decode() for m in c.read_all(topic))


def settled(admin_url) -> bool:
    """No transaction left undecided, and every decision durable (and replicated), so visible."""
    admin = AdminClient(admin_url)
    if admin.transactions(limit=0).total:
        return False
    i = admin.broker_info()
    return i.durable_offset == i.log_end_offset


def settle(address, admin_url, ledger, group="orders-pg", timeout=60) -> None:
    """Until every transaction at `address` is decided and visible: a producer of `group` answers
    the check-backs of those left undecided (from its ledger) meanwhile."""
    from support.waiting import wait_until

    async def go():
        async with AsyncTransactionProducer(group, address, ledger):
            await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(
                lambda: settled(admin_url), timeout, what=f"every transaction on {address} decided and visible"))
    asyncio.run(go())


def invariant_violations(seen: Counter, acked: dict, must_keep_acked: bool) -> list[str]:
    """I2 (no duplicate), I3 (no rolled-back message visible), and, when `must_keep_acked`
    (SYNC replication), I1 (no acknowledged commit lost)."""
    problems = [f"{b} visible {n} times" for b, n in seen.items() if n != 1]
    problems += [f"rolled-back {b} is visible" for b in seen if int(b.split("-")[1]) % 4 == 0]
    if must_keep_acked:
        lost = sorted({b for b, st in acked.items() if st is S.COMMIT} - set(seen))
        problems += [f"acknowledged commit {b} lost" for b in lost]
    return problems
