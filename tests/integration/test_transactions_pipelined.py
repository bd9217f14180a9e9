"""Transactions whose END_TRANSACTION is not waited for (`wait_end=False`, issue 33): a producer
goes on to its next transaction while its last decision is on its way, so the END and the next half
message travel, and are answered, together. Still acknowledged: each result's `ended` is done when
the broker has the decision (queue_offsets) or it could not be delivered (end_error; check-back
decides); flush() and close() wait for every one in flight."""

from __future__ import annotations

import asyncio

from support import txload
from support.waiting import wait_until
from txbroker.client import (
    AsyncTransactionProducer, LocalTransactionState as S, Message, TransactionListener, TransactionProducer,
)


class EveryFourthRolledBack(TransactionListener):
    def __init__(self):
        self.decided: dict[str, S] = {}

    def execute_local_transaction(self, msg, i):
        self.decided[msg.transaction_id] = S.ROLLBACK if i % 4 == 0 else S.COMMIT
        return self.decided[msg.transaction_id]

    def check_local_transaction(self, msg):
        return self.decided.get(msg.transaction_id, S.ROLLBACK)


def test_unwaited_ends_are_each_acknowledged_and_flushed(broker):
    listener = EveryFourthRolledBack()

    async def run():
        async with AsyncTransactionProducer("pipelined", broker.address, listener, wait_end=False) as p:
            results = [await p.send_message_in_transaction(Message("Orders", f"o{i}".encode()), i) for i in range(40)]
            assert all(r.ended is not None for r in results)
            await p.flush()
            assert all(r.ended.done() and not r.end_error for r in results)
            return results

    results = asyncio.run(run())
    committed = [r for r in results if r.local_state is S.COMMIT]
    assert len(committed) == 30 and all(r.queue_offsets for r in committed)   # as an awaited END answers
    assert txload.settled(broker.admin_url)
    assert txload.visible(broker.address) == {f"o{i}": 1 for i in range(40) if i % 4}


def test_a_producer_closed_right_after_its_sends_leaves_nothing_undecided(broker):
    listener = EveryFourthRolledBack()
    with TransactionProducer("pipelined", broker.address, listener, wait_end=False) as p:
        for i in range(20):
            p.send_message_in_transaction(Message("Orders", f"c{i}".encode()), i)
    # closed at once: close() waited for the ENDs in flight, so no check-back is needed
    assert txload.settled(broker.admin_url)
    assert txload.visible(broker.address) == {f"c{i}": 1 for i in range(20) if i % 4}


def test_an_end_that_cannot_be_delivered_is_reported_and_check_back_decides(broker):
    """The broker dies while the decision is on its way: flush() returns with end_error set on that
    result (not raised), and once the broker is back its check-back commits it."""
    class KillsTheBroker(EveryFourthRolledBack):
        def execute_local_transaction(self, msg, i):
            broker.kill()
            return super().execute_local_transaction(msg, i)

    listener = KillsTheBroker()

    async def run():
        async with AsyncTransactionProducer("pipelined", broker.address, listener, wait_end=False,
                                            request_timeout=1.0) as p:
            r = await p.send_message_in_transaction(Message("Orders", b"lost end"), 1)
            await p.flush()
            assert r.end_error, r
            broker.start()
            # (in a thread: this loop answers the check-back)
            await asyncio.to_thread(wait_until, lambda: txload.visible(broker.address) == {"lost end": 1}, 30,
                                    what="check-back to commit it")

    asyncio.run(run())
