"""The clients and what they saw, on a cluster of broker groups: every feature users lean on.

  transactions   two ClusterTransactionProducers, one waiting for each END and one not (wait_end=False:
                 its outcome recorded when the acknowledgement comes): 1-3 messages on Orders and
                 Billing; half of them
                 placed by key (so they may span groups), a fifth rolled back, some left UNKNOWN for
                 check-back; now and then an Orders message no consumer will accept (poison: it must
                 end as a dead letter)
  jobs           a ClusterJobCoordinator: jobs spanning every active group, 2-5 members spread over
                 them, all but one kept, a fifth aborted
  plain          a ClusterProducer on Plain
  ordered        a ClusterProducer on Ordered, by key (4 keys, a sequence number each, one send at a
                 time per key)
  consumers      group chaos-cg (two ClusterPushConsumers on Orders; a tenth of first deliveries
                 refused, so they come back through %RETRY%; poison always refused, so it goes to
                 %DLQ% after two retries) and group chaos-ord (two orderly ClusterPushConsumers on
                 Ordered, each delivery recorded in order); chaos-sink consumes Billing, Plain and the
                 dead letters (a group each), as someone would (a group drains only once what it holds was delivered)
  samplers       every group's committed offsets of both consumer groups, and the decisions of recent
                 jobs as their home answers, twice a second
  reader         chaos/reader.py: every group's topics read as they fill (retention deletes them)

Every operation is recorded in the History with its outcome as the client knows it: acknowledged
(the broker answered SUCCESS to the decision or the send), refused, or unknown (no answer). The
checker (checker.py) judges the whole history against it.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

from txbroker.client import (
    AsyncClusterJobCoordinator, AsyncClusterProducer, AsyncClusterPushConsumer, AsyncClusterTransactionProducer,
    AsyncPullConsumer, BrokerError, ClientError, ConsumeOrderlyStatus, ConsumeStatus, LocalTransactionState as S,
    Message, TransactionListener, hash_selector, key_selector,
)

from chaos.reader import JOB_PROPERTY, PART_PROPERTY, Reader

TOPICS = ("Orders", "Billing")
ORDERED = "Ordered"
GROUP = "chaos-pg"
JOB_GROUP = "chaos-jobs"
CONSUMER_GROUP = "chaos-cg"
ORDERLY_GROUP = "chaos-ord"
SINK_GROUP = "chaos-sink"
SINKS = (("billing", "Billing"), ("plain", "Plain"), ("dlq", f"%DLQ%{CONSUMER_GROUP}"))
CONSUMER_GROUPS = (CONSUMER_GROUP, ORDERLY_GROUP, *(f"{SINK_GROUP}-{name}" for name, _ in SINKS))
MAX_RECONSUME = 2
KEYS = ("k0", "k1", "k2", "k3")
GroupsNow = Callable[[], dict[str, list[str]]]  # the live groups and their brokers' addresses, now


@dataclass
class Tx:
    """One transaction (or job member, or plain send): its message bodies and what became of it."""
    bodies: list[str]
    intended: str  # COMMIT | ROLLBACK | EITHER (a job whose decision went unanswered: all kept or none)
    acked: str = ""  # the decision the broker acknowledged, if any
    kind: str = "tx"  # tx | member | plain | ordered
    job: str = ""  # a member's job
    groups: list[str] = field(default_factory=list)  # where its messages were placed (home first)
    queue_ids: list[int] = field(default_factory=list)  # and in which queue there (ordered sends)
    topics: list[str] = field(default_factory=list)  # each body's topic
    acked_at: float = 0.0  # monotonic time the decision was acknowledged (a backup's checker: before it or not)
    created_at: float = field(default_factory=time.monotonic)  # before any of its messages was sent


@dataclass
class History:
    txs: dict[str, Tx] = field(default_factory=dict)  # txid (or plain-<n>) -> Tx
    commits: list[float] = field(default_factory=list)  # monotonic time of each acknowledged commit
    failures: list[float] = field(default_factory=list)  # monotonic time of each failed client operation
    consumed: Counter = field(default_factory=Counter)  # body -> deliveries chaos-cg's listener accepted
    refused: Counter = field(default_factory=Counter)  # body -> deliveries it refused on purpose (retried)
    poison: set = field(default_factory=set)  # bodies no listener accepts: dead letters
    # chaos-ord: per key, the sequence numbers in the order they were delivered (again, at times)
    ordered_deliveries: dict = field(default_factory=lambda: defaultdict(list))
    # (time.time(), broker group, consumer group, queue, committed offset, broker that answered)
    offsets: list[tuple] = field(default_factory=list)
    decisions: list[tuple] = field(default_factory=list)  # (time.time(), job id, state its home answered)
    # (consumer group, broker group, topic, queue, first offset, first offset after): what retention
    # deleted before the consumer group got to it (its consumers skipped it, as Kafka's do)
    skipped: set = field(default_factory=set)
    skipped_seen: dict = field(default_factory=dict)  # each of those -> monotonic time first seen
    jobs: dict = field(default_factory=dict)  # job id -> its home group
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str, tx: Tx) -> None:
        with self.lock:
            self.txs[key] = tx

    def ack(self, key: str, state: str) -> None:
        with self.lock:
            self.txs[key].acked = state
            self.txs[key].acked_at = time.monotonic()
            if state == "COMMIT":
                self.commits.append(time.monotonic())

    def failed(self) -> None:
        with self.lock:
            self.failures.append(time.monotonic())


class Decisions(TransactionListener):
    """Answers the local transaction and every check-back from the intended decision; a check-back
    of a transaction whose local transaction never ran (its send raised first: e.g. a spanning
    transaction's home half stored, a participant's refused, the home's rollback lost) is answered
    ROLLBACK, as an application with no record of it would. Answering the intended COMMIT there
    committed the home's messages while the participant's never were stored (seeds 39, 40: torn,
    by the harness's own answer; chaos/k8s/pod.py answers so too)."""

    def __init__(self, history: History, rnd: random.Random):
        self.h = history
        self.rnd = rnd
        self.ran: set[str] = set()

    def execute_local_transaction(self, msg, arg):
        key, tx = arg
        self.ran.add(key)
        self.h.add(key, tx)
        d = S.COMMIT if tx.intended == "COMMIT" else S.ROLLBACK
        return S.UNKNOWN if self.rnd.random() < 0.15 else d  # left to check-back

    def check_local_transaction(self, msg):
        if msg.transaction_id not in self.ran:
            return S.ROLLBACK
        tx = self.h.txs.get(msg.transaction_id)
        return S.COMMIT if tx is not None and tx.intended == "COMMIT" else S.ROLLBACK


async def _until(event: threading.Event) -> None:
    while not event.is_set():
        await asyncio.sleep(0.1)


async def _started(client, stop: threading.Event):
    """Start a cluster client, again and again while no broker answers (a fault at the start)."""
    while True:
        try:
            return await client.start()
        except (ClientError, OSError):
            if stop.is_set():
                return None
            await asyncio.sleep(0.3)


async def _producer(bootstrap, h: History, stop: threading.Event, w: int, seed: int, done: threading.Event) -> None:
    rnd = random.Random(seed * 1000 + w)
    decisions = Decisions(h, rnd)
    p = AsyncClusterTransactionProducer(GROUP, bootstrap, decisions, request_timeout=5, route_refresh=1,
                                        wait_end=w % 2 == 0)
    if await _started(p, stop) is None:
        return
    n = 0
    try:
        while not stop.is_set():
            n += 1
            txid = f"t{w}-{n}"
            bodies = [f"{txid}.{k}" for k in range(rnd.randint(1, 3))]
            if rnd.random() < 0.03:
                bodies[0] += ".poison"  # bodies[0] goes to Orders
            tx = Tx(bodies, "ROLLBACK" if rnd.random() < 0.2 else "COMMIT", topics=[TOPICS[k % 2] for k in range(len(bodies))])
            by_key = rnd.random() < 0.5
            msgs = [Message(TOPICS[k % 2], b.encode(), keys=f"{txid}-{k}" if by_key else "")
                    for k, b in enumerate(bodies)]
            try:
                r = await p.send_message_in_transaction(msgs, (txid, tx), transaction_id=txid,
                                                        selector=key_selector if by_key else None)
            except (ClientError, ValueError):
                if txid not in decisions.ran:   # no local transaction: every check-back answers ROLLBACK
                    tx.intended = "ROLLBACK"
                h.add(txid, tx)
                h.failed()
                await asyncio.sleep(0.05)  # a client backs off before trying again
                continue
            tx.groups = r.groups
            if tx.bodies[0].endswith(".poison"):
                with h.lock:
                    h.poison.add(tx.bodies[0])
            if r.send_status != "SEND_OK":  # refused (e.g. no slave in sync): rolled back, try again soon
                h.failed()
                await asyncio.sleep(0.05)
            elif r.local_state is not S.UNKNOWN:
                if r.ended is None:
                    _record_end(h, txid, r)
                else:   # the END still on its way: recorded once it is acknowledged or given up on
                    r.ended.add_done_callback(lambda _f, txid=txid, r=r: _record_end(h, txid, r))
        await _until(done)  # still answering check-backs while the cluster settles
    finally:
        await p.close()


def _record_end(h: History, txid: str, r) -> None:
    if r.end_error:
        h.failed()
    else:
        h.ack(txid, r.local_state.name)


async def _coordinator(c: AsyncClusterJobCoordinator, h: History, stop: threading.Event, seed: int) -> None:
    rnd = random.Random(seed * 1000 + 99)
    if await _started(c, stop) is None:
        return
    n = 0
    while not stop.is_set():
        n += 1
        added: list[str] = []
        try:
            job = await c.open(timeout=20)
            with h.lock:
                h.jobs[job.job_id] = job.home
            groups = job.all_groups
            members: dict[str, list[str]] = {}
            order = []
            for k in range(rnd.randint(2, 5)):
                group = groups[k % len(groups)]
                txid = f"{job.job_id}-m{k}"
                # one message or two, the second with a property of its own over a shared one
                bodies = [f"job{n}.{k}"] + ([f"job{n}.{k}b"] if rnd.random() < 0.5 else [])
                tx = Tx(bodies, "COMMIT", kind="member", job=job.job_id, groups=[group], topics=["Orders"] * len(bodies))
                h.add(txid, tx)
                added.append(txid)
                # the job's id as a property every message carries, sent once (SEND_MESSAGE_SHARED,
                # stored once in the half record): the reader checks it on every member it reads
                # keyed, as a Spark task's rows are: a member's END queues its keys behind the log
                # (the reader reads each one by its key at the end)
                msgs = [Message("Orders", b.encode(), keys=f"{txid}-{i}",
                                properties={PART_PROPERTY: "b"} if b.endswith("b") else {})
                        for i, b in enumerate(bodies)]
                await c.send(job, group, msgs, txid, properties={JOB_PROPERTY: job.job_id, PART_PROPERTY: "a"})
                members.setdefault(group, []).append(txid)
                order.append(txid)
        except (ClientError, ValueError):
            # this job is never decided here: its deadline aborts it, so no member may be read
            for t in added:
                h.txs[t].intended = "ROLLBACK"
            h.failed()
            await asyncio.sleep(0.05)
            continue
        kept_ids = order[:max(1, len(order) - 1)] if rnd.random() < 0.8 else []
        for t in order:
            h.txs[t].intended = "COMMIT" if t in kept_ids else "ROLLBACK"
        kept = {g: [t for t in ids if t in kept_ids] for g, ids in members.items()}
        try:
            if kept_ids:
                await c.commit(job, kept)
            else:
                await c.abort(job)
        except BrokerError:  # e.g. aborted at its deadline: its members roll back
            for t in order:
                h.txs[t].intended = "ROLLBACK"
            h.failed()
            continue
        except ClientError:
            h.failed()  # unknown: the decision may or may not be recorded
            for t in kept_ids:
                h.txs[t].intended = "EITHER"
            continue
        for t in order:
            h.ack(t, "COMMIT" if t in kept_ids else "ROLLBACK")
        await asyncio.sleep(0.05)


async def _plain(bootstrap, h: History, stop: threading.Event) -> None:
    p = AsyncClusterProducer("chaos-plain", bootstrap, request_timeout=5, route_refresh=1)
    if await _started(p, stop) is None:
        return
    n = 0
    try:
        while not stop.is_set():
            n += 1
            key = f"plain-{n}"
            h.add(key, Tx([key], "COMMIT", kind="plain", topics=["Plain"]))
            try:
                r = await p.send(Message("Plain", key.encode()))
            except (ClientError, ValueError):
                h.failed()
                await asyncio.sleep(0.05)
                continue
            h.txs[key].groups = r.groups
            h.ack(key, "COMMIT")
            await asyncio.sleep(0.01)
    finally:
        await p.close()


async def _ordered(bootstrap, h: History, stop: threading.Event, seed: int) -> None:
    """Per key, one send at a time: the next only once the last was answered (or given up on)."""
    rnd = random.Random(seed * 1000 + 55)
    p = AsyncClusterProducer("chaos-ordered", bootstrap, request_timeout=5, route_refresh=1)
    if await _started(p, stop) is None:
        return
    seq = Counter()
    try:
        while not stop.is_set():
            key = rnd.choice(KEYS)
            seq[key] += 1
            body = f"ord-{key}-{seq[key]}"
            h.add(body, Tx([body], "COMMIT", kind="ordered", topics=[ORDERED]))
            try:
                r = await p.send(Message(ORDERED, body.encode(), keys=key), selector=hash_selector, arg=key)
            except (ClientError, ValueError):
                h.failed()
                await asyncio.sleep(0.05)
                continue
            h.txs[body].groups, h.txs[body].queue_ids = r.groups, r.queue_ids
            h.ack(body, "COMMIT")
            await asyncio.sleep(0.01)
    finally:
        await p.close()


class _Listener:
    """Accepts what it is given, except a message's first delivery one time in ten, and poison."""

    def __init__(self, h: History, rnd: random.Random):
        self.h, self.rnd = h, rnd

    def consume_message(self, msgs, ctx):
        with self.h.lock:
            for m in msgs:
                body = m.body.decode()
                if body.endswith(".poison") or (not self.h.refused[body] and self.rnd.random() < 0.1):
                    self.h.refused[body] += 1
                    return ConsumeStatus.RECONSUME_LATER
            self.h.consumed.update(m.body.decode() for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS


class _Sink:
    def consume_message(self, msgs, ctx):
        return ConsumeStatus.CONSUME_SUCCESS


class _OrderlyListener:
    """Records each key's deliveries in order; now and then asks for a batch again (suspend)."""

    def __init__(self, h: History, rnd: random.Random):
        self.h, self.rnd = h, rnd

    def consume_message(self, msgs, ctx):
        if self.rnd.random() < 0.05:
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        with self.h.lock:
            for m in msgs:
                _, key, n = m.body.decode().split("-")
                self.h.ordered_deliveries[key].append(int(n))
        return ConsumeOrderlyStatus.SUCCESS


async def _consumers(bootstrap, h: History, seed: int, stop: threading.Event, members_out: list) -> None:
    rnd = random.Random(seed * 1000 + 77)
    common = dict(request_timeout=5, route_refresh=1, rebalance_interval=2.0, offset_commit_interval=0.5,
                  long_poll_ms=1000)
    members = [AsyncClusterPushConsumer(CONSUMER_GROUP, bootstrap, "Orders", _Listener(h, rnd),
                                        max_reconsume_times=MAX_RECONSUME, **common) for _ in range(2)]
    members += [AsyncClusterPushConsumer(ORDERLY_GROUP, bootstrap, ORDERED, _OrderlyListener(h, rnd), orderly=True,
                                         suspend_current_queue_time_ms=200, **common) for _ in range(2)]
    # what nobody above consumes, consumed too: a group drains only once its messages were delivered
    members += [AsyncClusterPushConsumer(f"{SINK_GROUP}-{name}", bootstrap, topic, _Sink(), **common)
                for name, topic in SINKS]
    started = [m for m in members if await _started(m, stop) is not None]
    members_out.extend(started)
    await _until(stop)
    for m in started:
        await m.shutdown()


async def _skips(h: History, consumers: list, stop: threading.Event) -> None:
    """What retention deleted before each consumer group got to it, as the consumers say (their own
    memory, no request): sampled often, so that when a skip was first seen bounds its deletion
    closely (the checker's "deleted young")."""
    while not stop.is_set():
        for m in consumers:
            for group, ranges in m.skipped_ranges().items():
                now = time.monotonic()
                with h.lock:
                    for r in ranges:
                        h.skipped_seen.setdefault((m.group, group, *r), now)
                    h.skipped.update((m.group, group, *r) for r in ranges)
        await asyncio.sleep(0.1)


async def _samplers(groups_now: GroupsNow, h: History, coordinator: AsyncClusterJobCoordinator,
                    consumers: list, stop: threading.Event) -> None:
    readers: dict[str, AsyncPullConsumer] = {}
    turn = 0
    try:
        while not stop.is_set():
            for name, addresses in groups_now().items():
                reader = readers.get(name)
                if reader is None:
                    reader = readers[name] = AsyncPullConsumer(addresses, request_timeout=3)
                for cg, topic in ((CONSUMER_GROUP, "Orders"), (ORDERLY_GROUP, ORDERED)):
                    try:
                        offsets, _ends = await reader.committed_offsets(cg, topic)
                    except ClientError:
                        continue
                    now, by = time.time(), reader.client.address  # wall time: to find it in the brokers' logs
                    with h.lock:
                        h.offsets.extend((now, name, cg, q, o, by) for q, o in offsets.items())
            with h.lock:
                jobs = list(h.jobs.items())
            # the newest, and a turn through the older ones: a decision that changes long after it
            # was made (a failover, settling) is seen too, not only in its first seconds
            older = jobs[:-6]
            start = turn % len(older) if older else 0
            turn += 6
            await _decisions_of(jobs[-6:] + older[start:start + 6], coordinator, h)
            await asyncio.sleep(0.5)
        with h.lock:  # at the end, every job its home still holds
            jobs = list(h.jobs.items())
        await _decisions_of(jobs, coordinator, h)
    finally:
        for r in readers.values():
            await r.close()


async def _decisions_of(jobs: list[tuple[str, str]], coordinator: AsyncClusterJobCoordinator, h: History,
                        within: float = 20.0) -> None:
    """What each job's home answers about it now (COMMITTED, ABORTED, ...), into the history; a home
    that does not answer is not asked again this time."""
    deadline, silent = time.monotonic() + within, set()
    for job_id, home in jobs:
        member = coordinator.groups.members.get(home)
        if member is None or home in silent or time.monotonic() > deadline:
            continue
        try:
            info = await member.describe(job_id)
        except BrokerError:
            continue  # not there now: expired with the log
        except ClientError:
            silent.add(home)
            continue
        with h.lock:
            h.decisions.append((time.time(), job_id, info.state))


def run(bootstrap: list[str], groups_now: GroupsNow, h: History, reader: Reader, stop: threading.Event,
        done: threading.Event, seed: int, consumers_done: threading.Event, producers: int = 2) -> None:
    """Send until `stop`; the transactional producers keep answering check-backs until `done`; the
    consumer groups, the samplers and the reader run until `consumers_done`."""
    async def main():
        coordinator = AsyncClusterJobCoordinator(JOB_GROUP, bootstrap, request_timeout=5, route_refresh=1)
        consumers: list = []
        try:
            await asyncio.gather(*(_producer(bootstrap, h, stop, w, seed, done) for w in range(producers)),
                                 _coordinator(coordinator, h, stop, seed), _plain(bootstrap, h, stop),
                                 _ordered(bootstrap, h, stop, seed),
                                 _consumers(bootstrap, h, seed, consumers_done, consumers),
                                 _samplers(groups_now, h, coordinator, consumers, consumers_done),
                                 _skips(h, consumers, consumers_done),
                                 reader.run(consumers_done))
        finally:
            await coordinator.close()

    asyncio.run(main())
