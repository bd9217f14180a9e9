"""The clients and what they saw: transactional producers (one to three messages per transaction,
some rolled back, some left UNKNOWN for check-back), a job coordinator (coordinated transactions,
some members not kept, some jobs aborted), a plain producer, and a consumer group of two members
on the Orders topic whose listener fails a message's first delivery now and then (so it comes back
through the retry topic); all given every broker address. A sampler reads the group's committed
offsets from the master twice a second.

Every operation is recorded in the History with its outcome as the client knows it: acknowledged
(the broker answered SUCCESS to the decision, or to the plain send), refused, or unknown (no
answer). The checker (checker.py) judges the final state against it.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field

from collections import Counter

from txbroker.client import (
    AsyncJobCoordinator, AsyncProducer, AsyncPullConsumer, AsyncPushConsumer, AsyncTransactionProducer, BrokerError,
    ClientError, ConsumeStatus, LocalTransactionState as S, Message, TransactionListener,
)

TOPICS = ("Orders", "Billing")
GROUP = "chaos-pg"
JOB_GROUP = "chaos-jobs"
CONSUMER_GROUP = "chaos-cg"


@dataclass
class Tx:
    """One transaction (or job member): its message bodies and what became of it."""
    bodies: list[str]
    intended: str  # COMMIT | ROLLBACK | EITHER (a job whose decision went unanswered: all kept or none)
    acked: str = ""  # the decision the broker acknowledged, if any
    kind: str = "tx"  # tx | member | plain
    job: str = ""  # a member's job


@dataclass
class History:
    txs: dict[str, Tx] = field(default_factory=dict)  # txid (or plain-<n>) -> Tx
    commits: list[float] = field(default_factory=list)  # monotonic time of each acknowledged commit
    failures: list[float] = field(default_factory=list)  # monotonic time of each failed client operation
    consumed: Counter = field(default_factory=Counter)  # body -> deliveries the group's listener accepted
    refused: Counter = field(default_factory=Counter)  # body -> deliveries it failed on purpose (retried)
    # (time.time(), queue, committed offset, the broker that answered) of every read
    offsets: list[tuple[float, int, int, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str, tx: Tx) -> None:
        with self.lock:
            self.txs[key] = tx

    def ack(self, key: str, state: str) -> None:
        with self.lock:
            self.txs[key].acked = state
            if state == "COMMIT":
                self.commits.append(time.monotonic())

    def failed(self) -> None:
        with self.lock:
            self.failures.append(time.monotonic())


class Decisions(TransactionListener):
    """Answers the local transaction and every check-back from the intended decision."""

    def __init__(self, history: History, rnd: random.Random):
        self.h = history
        self.rnd = rnd

    def execute_local_transaction(self, msg, arg):
        key, tx = arg
        self.h.add(key, tx)
        d = S.COMMIT if tx.intended == "COMMIT" else S.ROLLBACK
        return S.UNKNOWN if self.rnd.random() < 0.15 else d  # left to check-back

    def check_local_transaction(self, msg):
        tx = self.h.txs.get(msg.transaction_id)
        return S.COMMIT if tx is not None and tx.intended == "COMMIT" else S.ROLLBACK


async def _until(event: threading.Event) -> None:
    while not event.is_set():
        await asyncio.sleep(0.1)


async def _producer(addresses, h: History, stop: threading.Event, w: int, seed: int,
                    done: threading.Event) -> None:
    rnd = random.Random(seed * 1000 + w)
    p = AsyncTransactionProducer(GROUP, addresses, Decisions(h, rnd), request_timeout=5)
    await p.start()
    n = 0
    try:
        while not stop.is_set():
            n += 1
            txid = f"t{w}-{n}"
            bodies = [f"{txid}.{k}" for k in range(rnd.randint(1, 3))]
            tx = Tx(bodies, "ROLLBACK" if rnd.random() < 0.2 else "COMMIT")
            msgs = [Message(TOPICS[k % 2], b.encode()) for k, b in enumerate(bodies)]
            try:
                r = await p.send_message_in_transaction(msgs, (txid, tx), transaction_id=txid)
            except ClientError:
                h.add(txid, tx)
                h.failed()
                await asyncio.sleep(0.05)  # a client backs off before trying again
                continue
            if r.send_status != "SEND_OK":  # refused (e.g. no slave in sync): rolled back, try again soon
                h.failed()
                await asyncio.sleep(0.05)
            elif r.local_state is not S.UNKNOWN and not r.end_error:
                h.ack(txid, r.local_state.name)
            elif r.end_error:
                h.failed()
        await _until(done)  # still answering check-backs while the cluster settles
    finally:
        await p.close()


async def _coordinator(addresses, h: History, stop: threading.Event, seed: int) -> None:
    rnd = random.Random(seed * 1000 + 99)
    n = 0
    async with AsyncJobCoordinator(JOB_GROUP, addresses, request_timeout=5) as c:
        while not stop.is_set():
            n += 1
            try:
                job = await c.open(timeout=20)
                members = []
                for k in range(rnd.randint(2, 5)):
                    txid = f"{job.job_id}-m{k}"
                    tx = Tx([f"job{n}.{k}"], "COMMIT", kind="member", job=job.job_id)
                    h.add(txid, tx)
                    await c.send(job.job_id, Message("Orders", tx.bodies[0].encode()), txid)
                    members.append(txid)
            except ClientError:
                h.failed()
                await asyncio.sleep(0.05)
                continue
            kept = members[:max(1, len(members) - 1)] if rnd.random() < 0.8 else []
            for t in members:
                h.txs[t].intended = "COMMIT" if t in kept else "ROLLBACK"
            try:
                if kept:
                    await c.commit(job.job_id, kept)
                else:
                    await c.abort(job.job_id)
            except BrokerError:  # e.g. aborted at its deadline: its members roll back
                for t in members:
                    h.txs[t].intended = "ROLLBACK"
                h.failed()
                continue
            except ClientError:
                h.failed()  # unknown: the decision may or may not be recorded
                for t in kept:
                    h.txs[t].intended = "EITHER"
                continue
            for t in members:
                h.ack(t, "COMMIT" if t in kept else "ROLLBACK")
            await asyncio.sleep(0.05)


async def _plain(addresses, h: History, stop: threading.Event) -> None:
    p = AsyncProducer("chaos-plain", addresses, request_timeout=5)
    n = 0
    try:
        while not stop.is_set():
            n += 1
            key = f"plain-{n}"
            h.add(key, Tx([key], "COMMIT", kind="plain"))
            try:
                await p.send(Message("Plain", key.encode()))
            except ClientError:
                h.failed()
                await asyncio.sleep(0.05)
                continue
            h.ack(key, "COMMIT")
            await asyncio.sleep(0.01)
    finally:
        await p.close()


class _Listener:
    """Accepts what it is given, except a message's first delivery, one time in ten."""

    def __init__(self, h: History, rnd: random.Random):
        self.h, self.rnd = h, rnd

    def consume_message(self, msgs, ctx):
        with self.h.lock:
            for m in msgs:
                body = m.body.decode()
                if not self.h.refused[body] and self.rnd.random() < 0.1:
                    self.h.refused[body] += 1
                    return ConsumeStatus.RECONSUME_LATER
            self.h.consumed.update(m.body.decode() for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS


async def _consumers(addresses, h: History, seed: int, done: threading.Event) -> None:
    rnd = random.Random(seed * 1000 + 77)
    members = [AsyncPushConsumer(CONSUMER_GROUP, addresses, "Orders", _Listener(h, rnd), request_timeout=5,
                                 rebalance_interval=2.0, offset_commit_interval=0.5, long_poll_ms=1000)
               for _ in range(2)]
    for m in members:
        while not done.is_set():
            try:
                await m.start()
                break
            except ClientError:  # Orders not created yet, or the master changing
                await asyncio.sleep(0.2)
    async with AsyncPullConsumer(addresses, request_timeout=3) as reader:
        while not done.is_set():
            try:
                offsets, _ends = await reader.committed_offsets(CONSUMER_GROUP, "Orders")
                now, by = time.time(), reader.client.address  # wall time: to find it in the brokers' logs
                with h.lock:
                    h.offsets.extend((now, q, o, by) for q, o in offsets.items())
            except ClientError:
                pass
            await asyncio.sleep(0.5)
    for m in members:
        await m.shutdown()


def run(addresses: list[str], h: History, stop: threading.Event, done: threading.Event, seed: int,
        consumers_done: threading.Event, producers: int = 3) -> None:
    """Send until `stop`; the transactional producers keep answering check-backs until `done`; the
    consumer group consumes until `consumers_done`."""
    async def main():
        await asyncio.gather(*(_producer(addresses, h, stop, w, seed, done) for w in range(producers)),
                             _coordinator(addresses, h, stop, seed), _plain(addresses, h, stop),
                             _consumers(addresses, h, seed, consumers_done))

    asyncio.run(main())
