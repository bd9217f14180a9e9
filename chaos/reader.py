"""Every group's topics read as they fill: the harness's record of what the cluster served, kept
while retention deletes it (the schedules run with a short retention, so a read at the end would
find little).

Per broker group, per topic and queue, the reader pulls from the group's master from the queue's
first message onwards and records each message at its position (group, topic, queue, offset). What
it finds is judged as Jepsen judges a log:

  rewritten   a position read twice (a re-read of a recent stretch, every few seconds, and of
              everything still stored at the end) with two different messages: the log the
              clients were served changed under them
  went back   a queue's end, as its master says, below an offset already read from it
  read stuck  a queue read again from its start (at the end) that a pull cannot get past: nothing
              read and no further offset, below where the queue goes on (seed 556: a range
              retention emptied stopped every reader starting below it)
  skipped     offsets retention deleted before the reader got to them (not an anomaly: the
              reader fell behind; every such offset is counted so a report shows the checks
              did not cover it)
  key lost    a keyed message of a transaction or a job member, still stored at the end (read in
              the last pass), that a read by its key on its group does not find: the key index is
              written behind the log, across kills, power loss, truncation and retention
              (store/derived/key_index.py)
  key phantom a read by such a message's key (unique to it: `<txid>-<k>`) that finds another

It also keeps the JOB_PROPERTY each job member's message was read with (the coordinator sends it
once for the member's messages, and a second message's own PART_PROPERTY over the shared one; the
checker's `properties lost`).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from txbroker.client import AsyncPullConsumer, BrokerError, ClientError
from txbroker.protocol.codes import ResponseCode

READ_TOPICS = ("Orders", "Billing", "Plain", "Ordered", "%DLQ%chaos-cg")
JOB_PROPERTY = "chaos.job"  # a job member's messages carry their job's id (workload.py)
PART_PROPERTY = "chaos.part"  # shared "a"; a member's second message ("...b") carries its own "b"
# After a queue was cut (its master now ends it below what was read), this many positions below the
# new end are read again: an ASYNC failover diverges some records before the cut. The same stretch
# below the next offset is read again after an outage (a pull failed): a whole group's power cut
# under ASYNC flush can take what was read, and new writes refill the queue past the reader's next
# offset before its first pull that answers, so no cut shows (seed 706).
REREAD_AFTER_CUT = 256
KEYED_TOPICS = ("Orders", "Billing")  # transactions and job members key each message `<txid>-<k>`: unique
MAX_KEY_CHECKS = 1500  # per group: a read by key each, at the end


@dataclass
class Reader:
    groups_now: Callable[[], dict[str, list[str]]]  # the live groups and their brokers' addresses
    topics: tuple[str, ...] = READ_TOPICS
    seen: dict = field(default_factory=dict)  # (group, topic, queue, offset) -> body
    next: dict = field(default_factory=dict)  # (group, topic, queue) -> next offset to read
    rewritten: list = field(default_factory=list)
    went_back: list = field(default_factory=list)
    stuck: list = field(default_factory=list)
    suspect: set = field(default_factory=set)  # (group, topic, queue) whose last pull failed
    skipped: dict = field(default_factory=lambda: defaultdict(int))  # (group, topic) -> offsets
    queues: dict = field(default_factory=dict)  # (group, topic) -> queue count
    # a job member's body -> every JOB_PROPERTY value it was read with (a re-read must not hide a read without it)
    member_jobs: dict = field(default_factory=lambda: defaultdict(set))
    key_lost: list = field(default_factory=list)
    key_phantom: list = field(default_factory=list)
    keys_checked: int = 0
    keys_gone: int = 0  # not checked: retention deleted them between the last pass and their check
    # the last pass's keyed transactional messages: (group, topic, key) -> (queue, offset, body)
    stored_keyed: dict = field(default_factory=dict)
    last_pass: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    rnd: random.Random = field(default_factory=lambda: random.Random(0))

    def bodies(self, topic: str) -> dict[str, list[tuple]]:
        """body -> every position it was read at, for one topic over all groups."""
        out: dict[str, list[tuple]] = defaultdict(list)
        with self.lock:
            for (g, t, q, o), body in self.seen.items():
                if t == topic:
                    out[body].append((g, q, o))
        return out

    def queues_groups(self) -> list[str]:
        return sorted({g for g, _t in self.queues})

    async def run(self, stop: threading.Event) -> None:
        """Follow every group (one task each, its queues read at once) until `stop`."""
        tasks: dict[str, asyncio.Task] = {}
        try:
            while not stop.is_set():
                for group, addresses in self.groups_now().items():
                    if group not in tasks:
                        tasks[group] = asyncio.create_task(self._follow(group, addresses, stop))
                await asyncio.sleep(0.5)
        finally:
            for t in tasks.values():
                t.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)

    async def _follow(self, group: str, addresses: list[str], stop: threading.Event) -> None:
        last_verify = time.monotonic()
        async with AsyncPullConsumer(addresses, request_timeout=3) as c:
            while not stop.is_set() and group in self.groups_now():
                moved = await self._read_group(group, c)
                if time.monotonic() - last_verify > 3:
                    last_verify = time.monotonic()
                    await self._verify_recent(group, c)
                if not moved:
                    await asyncio.sleep(0.1)

    async def catch_up(self, deadline: float) -> bool:
        """Read every live group to its end, then everything still stored once more (verified).
        False if a group could not be read to its end before `deadline` (monotonic)."""
        clients = {g: AsyncPullConsumer(a, request_timeout=3) for g, a in self.groups_now().items()}
        try:
            while time.monotonic() < deadline:
                behind = 0
                for group, c in clients.items():
                    behind += await self._read_group(group, c, to_end=True)
                if not behind:
                    self.last_pass = True
                    try:
                        for group, c in clients.items():
                            await self._verify_all(group, c)
                    finally:
                        self.last_pass = False
                    for group, c in clients.items():
                        await self._verify_keys(group, c)
                    return True
                await asyncio.sleep(0.2)
            return False
        finally:
            for c in clients.values():
                await c.close()

    async def read_to_end(self, group: str, addresses: list[str], timeout: float) -> bool:
        """One group read to its end now (before it leaves the cluster, taking what it holds along)."""
        deadline = time.monotonic() + timeout
        async with AsyncPullConsumer(addresses, request_timeout=3) as c:
            while time.monotonic() < deadline:
                if not await self._read_group(group, c, to_end=True):
                    return True
                await asyncio.sleep(0.1)
        return False

    # ---- reading ---------------------------------------------------------------------------------

    async def _read_group(self, group: str, c: AsyncPullConsumer, to_end: bool = False) -> int:
        """Messages read now, every queue of the group at once (to_end: plus queues not yet read to
        their end, or that could not be read)."""
        reads = []
        for topic in self.topics:
            count = self.queues.get((group, topic))
            if count is None:
                try:
                    count = self.queues[(group, topic)] = await c.queue_count(topic)
                except ClientError:
                    continue  # not created on this group (yet), or its master is changing
            reads += [self._read_queue(group, topic, q, c) for q in range(count)]
        n = 0
        for got in await asyncio.gather(*reads, return_exceptions=True):
            if isinstance(got, BaseException):
                if not isinstance(got, ClientError):
                    raise got
                n += 1 if to_end else 0
                continue
            n += got[0] + (got[1] if to_end else 0)
        return n

    async def _read_queue(self, group: str, topic: str, q: int, c: AsyncPullConsumer) -> tuple[int, int]:
        key = (group, topic, q)
        offset = self.next.get(key, 0)
        try:
            r = await c.pull(topic, q, offset, 64)
        except BrokerError as e:
            if e.code != ResponseCode.PULL_OFFSET_MOVED:
                self.suspect.add(key)
                raise
            if "before the start" in str(e):  # retention got there first
                start = await c.search_offset(topic, q, 0)
                self.skipped[(group, topic)] += max(start - offset, 0)
                self.next[key] = max(start, offset)
                return 0, 1
            # beyond the end: the queue is shorter than what was read from it
            with self.lock:
                self.went_back.append(f"{group} {topic}:{q}: read to offset {offset}, then the master says "
                                      f"the queue ends before it ({e})")
            end = self.next[key] = await c.search_offset(topic, q, 2 ** 62)
            await self._reread(group, topic, q, c, max(end - REREAD_AFTER_CUT, 0), end)
            self.suspect.discard(key)
            return 0, 0
        except ClientError:
            self.suspect.add(key)
            raise
        if key in self.suspect:  # the first answer after an outage: what was read may have been cut
            await self._reread(group, topic, q, c, max(offset - REREAD_AFTER_CUT, 0), offset)
            self.suspect.discard(key)
        with self.lock:
            for m in r.messages:
                self._record(group, topic, q, m.queue_offset, m)
        if r.next_offset < offset and r.max_offset < offset:
            with self.lock:
                self.went_back.append(f"{group} {topic}:{q}: read to offset {offset}, queue now ends at "
                                      f"{r.max_offset}")
        self.next[key] = max(r.next_offset, offset)
        return len(r.messages), max(r.max_offset - self.next[key], 0)

    async def _reread(self, group: str, topic: str, q: int, c: AsyncPullConsumer, start: int, end: int) -> None:
        """[start, end) read again from the master now serving, recorded again (`rewritten` where it
        differs): everything still stored at the end, and after a cut what was read below the new
        end, which came from the old master (an ASYNC failover diverges before the cut)."""
        offset = start
        while offset < end:
            try:
                r = await c.pull(topic, q, offset, min(256, end - offset))
            except BrokerError as e:
                if e.code != ResponseCode.PULL_OFFSET_MOVED:
                    raise
                if "before the start" not in str(e):
                    return  # the queue ends before `end` now: nothing more to read
                offset = await c.search_offset(topic, q, 0)  # retention got there first
                continue
            if not r.messages:
                if r.next_offset <= offset < min(end, r.max_offset):
                    with self.lock:
                        self.stuck.append(f"{group} {topic}:{q}: a pull from offset {offset} reads nothing and "
                                          f"moves no further, though the queue goes on to {r.max_offset}")
                return
            with self.lock:
                for m in r.messages:
                    if m.queue_offset < end:
                        self._record(group, topic, q, m.queue_offset, m)
            offset = r.next_offset

    def _record(self, group: str, topic: str, q: int, offset: int, m) -> None:
        body = m.body.decode(errors="replace")
        if topic == "Orders" and body.startswith("job"):
            job = m.properties.get(JOB_PROPERTY)
            if body.endswith("b") and m.properties.get(PART_PROPERTY) != "b":  # its own must win
                job = f"{job} without its own {PART_PROPERTY}"
            self.member_jobs[body].add(job)
        if self.last_pass and topic in KEYED_TOPICS and getattr(m, "keys", ""):
            self.stored_keyed[(group, topic, m.keys)] = (q, offset, body)
        pos = (group, topic, q, offset)
        before = self.seen.get(pos)
        if before is None:
            self.seen[pos] = body
        elif before != body:
            self.rewritten.append(f"{group} {topic}:{q} offset {offset}: read {before!r}, later {body!r}")
            self.seen[pos] = body

    async def _verify_recent(self, group: str, c: AsyncPullConsumer) -> None:
        """A recent stretch of one queue read again."""
        keys = [k for k in self.next if k[0] == group and self.next[k] > 0]
        if not keys:
            return
        g, topic, q = self.rnd.choice(keys)
        start = max(self.next[(g, topic, q)] - 32, 0)
        try:
            r = await c.pull(topic, q, start, 32)
        except ClientError:
            return
        with self.lock:
            for m in r.messages:
                if m.queue_offset < self.next[(g, topic, q)]:
                    self._record(group, topic, q, m.queue_offset, m)

    async def _verify_keys(self, group: str, c: AsyncPullConsumer) -> None:
        """Every keyed message of the last pass on `group` (at most MAX_KEY_CHECKS, a sample), read
        by its key; one retention deleted since (the checks take seconds, retention is 20 s) is
        passed over."""
        todo = sorted((t, k, v) for (g, t, k), v in self.stored_keyed.items() if g == group)
        if len(todo) > MAX_KEY_CHECKS:
            todo = self.rnd.sample(todo, MAX_KEY_CHECKS)
        for topic, key, (q, offset, body) in todo:
            try:
                found = [m.body.decode(errors="replace") for m in await c.find_by_key(topic, key)]
                if body not in found and not await self._still_stored(c, topic, q, offset):
                    self.keys_gone += 1  # retention deleted it after the last pass read it
                    continue
            except ClientError as e:
                self.key_lost.append(f"{group} {topic}:{q} offset {offset} {body}: reading key {key!r} failed: {e}")
                continue
            self.keys_checked += 1
            if body not in found:
                self.key_lost.append(f"{group} {topic}:{q} offset {offset} {body}: not found by its key {key!r}")
            others = sorted(set(found) - {body})
            if others:
                self.key_phantom.append(f"{group} {topic} key {key!r} of {body}: also finds {', '.join(others)}")

    @staticmethod
    async def _still_stored(c: AsyncPullConsumer, topic: str, q: int, offset: int) -> bool:
        """Whether a queue still holds `offset` (retention deletes around the records it keeps, so
        a queue's first offset says nothing of one above it)."""
        try:
            r = await c.pull(topic, q, offset, 1)
        except BrokerError as e:
            if e.code == ResponseCode.PULL_OFFSET_MOVED:
                return False
            raise
        return any(m.queue_offset == offset for m in r.messages)

    async def _verify_all(self, group: str, c: AsyncPullConsumer) -> None:
        for (g, topic, q), end in list(self.next.items()):
            if g != group:
                continue
            await self._reread(group, topic, q, c, await c.search_offset(topic, q, 0), end)
