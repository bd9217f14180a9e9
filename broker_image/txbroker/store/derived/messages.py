"""Messages and queues: topics, the queue index (cq: where each queue's messages are), queue ends,
what readers may see, and consumers' send-backs. The key index (lookup by message key) is its own
family, written behind the log (key_index.py): a record here only queues its keys there.

A message becomes readable through an index entry: a plain send's at once (NormalRecord), a
transaction's at its commit (the EndRecord indexes the half record's messages, which are never
copied), a parked one's in TRANS_CHECK_MAX_TIME_TOPIC (ParkRecord). Entries become visible to
readers only when their batch is published (`publish`); `readable_end` never passes that.
"""

from __future__ import annotations

import asyncio
import heapq
from typing import TYPE_CHECKING

from txbroker.protocol.names import SCHEDULE_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC
from txbroker.store import keys
from txbroker.store.db import last_item_with_prefix
from txbroker.store.derived.family import Family
from txbroker.store.derived.latest import walk_back
from txbroker.store.records import (
    EndRecord, NormalRecord, ParkRecord, Record, TopicRecord, decode_record, keys_of, runs_of,
)

if TYPE_CHECKING:
    from rocksdict import WriteBatch

    from txbroker.store.db import Database
    from txbroker.store.derived.key_index import KeyIndex
    from txbroker.store.group_commit import Batch

TOPIC_PREFIX = b"topic/"


def _topic_value(count: int, lsn: int) -> bytes:
    return b"%d %d" % (count, lsn)


def _topic_decode(v: bytes) -> tuple[int, int]:
    """(queue count, LSN of the record that set it); format 4 stored the count alone."""
    count, _, lsn = v.partition(b" ")
    return int(count), int(lsn or 0)


class Messages(Family):
    def __init__(self, db: "Database", key_index: "KeyIndex"):
        self._db = db
        self._key_index = key_index
        self._h_cq, self._h_meta = db.handles["cq"], db.handles["meta"]
        self.topics: dict[str, int] = {}
        self._topic_lsn: dict[str, int] = {}
        self.queue_ends: dict[bytes, int] = {}  # next offset to assign, per queue prefix
        self.visible_end: dict[bytes, int] = {}  # offsets below this are published and readable
        self._queue_start: dict[bytes, int] = {}  # first stored offset (retention deletes from the front)
        self._waiters: dict[bytes, list[asyncio.Future]] = {}
        self._unwritten_send_backs: dict[bytes, int] = {}  # of the open batch: key -> LSN
        # Read whole: while a committed job's members are being ended, each queue they go to is
        # readable only up to where the first of them goes (Kafka's last stable offset), until the
        # last one's end is published: queue prefix -> {job id: that offset}.
        self._holds: dict[bytes, dict[str, int]] = {}
        self._releases: list[tuple[int, str]] = []  # (LSN of a job's last member end, job id), a heap

    def appliers(self):
        return {NormalRecord: self.apply_normal, TopicRecord: self.apply_topic}

    # ---- memory --------------------------------------------------------------------------------

    def load(self) -> None:
        self._holds.clear()
        self._releases.clear()
        self.topics.clear()
        self._topic_lsn.clear()
        self.queue_ends.clear()
        self.visible_end.clear()
        self._queue_start.clear()
        self._unwritten_send_backs.clear()
        for k, v in self._db.meta.items(from_key=TOPIC_PREFIX):
            if not k.startswith(TOPIC_PREFIX):
                break
            name = k[len(TOPIC_PREFIX):].decode()
            self.topics[name], self._topic_lsn[name] = _topic_decode(v)
        for topic, count in list(self.topics.items()) + [(TRANS_CHECK_MAX_TIME_TOPIC, 1)]:
            for q in range(count):
                self._load_queue_end(keys.queue_prefix(topic, q))
        # The delay queues have no topic record (one queue per level, as the schedule service sets):
        # each found on disk, so the first mark after a restart keeps its newest record too.
        for q in self._queues_on_disk(SCHEDULE_TOPIC):
            self._load_queue_end(keys.queue_prefix(SCHEDULE_TOPIC, q))

    def _queues_on_disk(self, topic: str):
        """The queue ids of `topic` that have index entries (a seek per queue)."""
        base = topic.encode() + b"\x00"
        it = self._db.cq.iter()
        it.seek(base)
        while it.valid() and it.key().startswith(base):
            q = keys.queue_id_of(it.key()[len(base):len(base) + 2])
            yield q
            it.seek(keys.queue_prefix(topic, q + 1))

    def _load_queue_end(self, prefix: bytes) -> int:
        last = last_item_with_prefix(self._db.cq, prefix)
        end = keys.cq_offset(last[0]) + keys.cq_run_decode(last[1])[2] if last else 0
        self.queue_ends[prefix] = end
        self.visible_end[prefix] = end
        return end

    def written(self, b: "Batch") -> None:
        if self._unwritten_send_backs:
            self._unwritten_send_backs.clear()

    # ---- applying -------------------------------------------------------------------------------

    def apply_normal(self, r: NormalRecord, lsn: int, b: "Batch") -> None:
        msgs = r.messages
        runs = runs_of(msgs)
        self.index(b, lsn, runs, r.queue_offsets)
        texts = keys_of(msgs)
        if texts:
            self._key_index.add(lsn, lsn, runs, r.queue_offsets, texts)
        if r.send_back:
            b.wb.put(r.send_back, keys.lsn_key(lsn), self._h_meta)
            self._unwritten_send_backs[r.send_back] = lsn

    def apply_topic(self, r: TopicRecord, lsn: int, b: "Batch") -> None:
        self.topics[r.name] = r.queue_count
        self._topic_lsn[r.name] = lsn
        b.wb.put(TOPIC_PREFIX + r.name.encode(), _topic_value(r.queue_count, lsn), self._h_meta)

    def reserve(self, runs: list[tuple[str, int, int]]) -> list[int]:
        """Each message's next offset in its queue, for messages in runs (topic, queue, count)."""
        ends = self.queue_ends
        offsets: list[int] = []
        for topic, queue, n in runs:
            prefix = keys.queue_prefix(topic, queue)
            start = ends.get(prefix)
            if start is None:
                start = self._load_queue_end(prefix)
            ends[prefix] = start + n
            offsets.extend(range(start, start + n))
        return offsets

    def index(self, b: "Batch", lsn: int, runs, offsets) -> None:
        """Queue-index entries for the messages of record `lsn` (becoming visible when published):
        one per run of consecutive messages bound for one queue at consecutive offsets. `runs`:
        (topic, queue, count) of the record's messages, in order."""
        put = b.wb.put
        h = self._h_cq
        lsn_key, run_value = keys.lsn_key, keys.cq_run_value
        visible, queue_end = b.visible, self.queue_ends
        i = 0
        for topic, queue, n in runs:
            prefix = keys.queue_prefix(topic, queue)
            first = offsets[i]
            run = offsets[i:i + n]
            if run[-1] - first == n - 1 and run == list(range(first, first + n)):
                put(prefix + lsn_key(first), run_value(lsn, i, n), h)
                end = first + n
            else:  # never written by this broker's own records, but a record may say so
                for j, off in enumerate(run, i):
                    put(prefix + lsn_key(off), run_value(lsn, j, 1), h)
                end = max(run) + 1
            if visible.get(prefix, -1) < end:
                visible[prefix] = end
            if queue_end.get(prefix, 0) < end:  # a replica learns offsets from the record
                queue_end[prefix] = end
            i += n

    def index_parked(self, b: "Batch", half_lsn: int, count: int, offsets: list[int]) -> None:
        self.index(b, half_lsn, [(TRANS_CHECK_MAX_TIME_TOPIC, 0, count)], offsets)

    # ---- what readers see --------------------------------------------------------------------------

    def queue_end(self, topic: str, queue_id: int) -> int:
        """Next offset to assign (the master's view, may be ahead of what is published)."""
        prefix = keys.queue_prefix(topic, queue_id)
        end = self.queue_ends.get(prefix)
        return end if end is not None else self._load_queue_end(prefix)

    def readable_end(self, topic: str, queue_id: int) -> int:
        """Offsets below this are published, and no job being resolved holds them: readers may see them."""
        prefix = keys.queue_prefix(topic, queue_id)
        end = self.visible_end.get(prefix)
        if end is None:
            self.queue_end(topic, queue_id)
            end = self.visible_end.get(prefix, 0)
        held = self._holds.get(prefix)
        if held:
            return min(end, min(held.values()))
        return end

    # ---- read whole: jobs being resolved --------------------------------------------------------

    def hold(self, job_id: str, queues: set[tuple[str, int]]) -> None:
        """A committed job's members go to these queues: readers stop where the first of them goes
        until `release_when_published`'s LSN is published (one job becomes readable in one step)."""
        for dest in queues:
            prefix = keys.queue_prefix(*dest)
            start = self.queue_ends.get(prefix)
            if start is None:
                start = self._load_queue_end(prefix)
            self._holds.setdefault(prefix, {})[job_id] = start

    def hold_at(self, job_id: str, prefix: bytes, offset: int) -> None:
        """As `hold`, at a known offset (a restart holds where the job's first ended member went)."""
        held = self._holds.setdefault(prefix, {})
        held[job_id] = min(offset, held.get(job_id, offset))

    def release_when_published(self, job_id: str, lsn: int) -> None:
        heapq.heappush(self._releases, (lsn, job_id))

    def published_through(self, durable_lsn: int) -> None:
        releases = self._releases
        while releases and releases[0][0] <= durable_lsn:
            _lsn, job_id = heapq.heappop(releases)
            self._release(job_id)

    def _release(self, job_id: str) -> None:
        waiters = self._waiters
        for prefix in [p for p, held in self._holds.items() if job_id in held]:
            held = self._holds[prefix]
            del held[job_id]
            if not held:
                del self._holds[prefix]
            for w in waiters.pop(prefix, ()):
                if not w.done():
                    w.set_result(None)

    def holds(self) -> dict[bytes, dict[str, int]]:
        return self._holds

    def queue_start(self, topic: str, queue_id: int) -> int:
        """The first offset of a queue still stored (retention deletes from the front)."""
        prefix = keys.queue_prefix(topic, queue_id)
        start = self._queue_start.get(prefix)
        if start is None:
            it = self._db.cq.iter()
            it.seek(prefix)
            if not (it.valid() and it.key().startswith(prefix)):
                # Nothing stored: what is published was deleted, what is not may not be written yet (the
                # fault harness, seeds 465 and 471: a pull between a queue's first commit and its write
                # cached the reserved end as the start, and the group skipped those messages). Not cached.
                return self.readable_end(topic, queue_id)
            start = self._queue_start[prefix] = keys.cq_offset(it.key())
        return start

    def publish(self, visible: dict[bytes, int]) -> None:
        """A batch's queue ends become readable; wake the readers waiting on those queues."""
        visible_end, waiters = self.visible_end, self._waiters
        for prefix, end in visible.items():
            if visible_end.get(prefix, 0) < end:
                visible_end[prefix] = end
            ws = waiters.pop(prefix, None)
            if ws:
                for w in ws:
                    if not w.done():
                        w.set_result(None)

    def hide(self, record: Record, half_of) -> dict[bytes, int]:
        """After a restart, a record not yet published: its entries are not readable. Returns the
        queue ends it would make visible (published later)."""
        ends: dict[bytes, int] = {}
        for prefix, offset in self.queue_entries(record, half_of):
            if self.queue_ends.get(prefix) is None:
                self._load_queue_end(prefix)
            if offset < self.visible_end[prefix]:
                self.visible_end[prefix] = offset
            ends[prefix] = max(ends.get(prefix, 0), offset + 1)
        return ends

    def wait_visible(self, prefix: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(prefix, []).append(fut)
        return fut

    def forget_waiter(self, prefix: bytes, fut: asyncio.Future) -> None:
        ws = self._waiters.get(prefix)
        if ws and fut in ws:
            ws.remove(fut)

    def send_back_lsn(self, key: bytes) -> int | None:
        """Where the send-back `key` was stored, if it was."""
        lsn = self._unwritten_send_backs.get(key)
        if lsn is not None:
            return lsn
        v = self._db.meta.get(key)
        return keys.lsn_from_key(v) if v is not None else None

    # ---- retention ----------------------------------------------------------------------------------

    def lineage(self):
        """Each topic's newest TopicRecord (truncation derives the topic from it), and the record of
        each queue's newest message: a queue's end is derived from its last index entry, so a queue
        retention emptied would start again at 0 after a restart, below where its consumers stand."""
        needed = set(self._topic_lsn.values())
        for prefix in list(self.queue_ends):
            last = last_item_with_prefix(self._db.cq, prefix)
            if last is not None:
                needed.add(keys.cq_run_decode(last[1])[0])
        return needed

    def forget(self, lsn: int, record: Record, wb: "WriteBatch", p=None) -> None:
        if type(record) is NormalRecord:
            self.forget_messages(wb, lsn, record.messages, record.queue_offsets)
            if record.send_back:
                wb.delete(record.send_back, self._h_meta)

    def forget_messages(self, wb: "WriteBatch", lsn: int, messages, offsets) -> None:
        """Delete what made record `lsn`'s messages readable at `offsets`: their queue-index and
        key-index entries (retention and truncation)."""
        for m, offset in zip(messages, offsets):
            prefix = keys.queue_prefix(m.topic, m.queue_id)
            wb.delete(keys.cq_key(prefix, offset), self._h_cq)
            self._queue_start.pop(prefix, None)
        self._key_index.forget_entries(wb, lsn, messages)

    def forget_parked(self, wb: "WriteBatch", offsets: list[int]) -> None:
        prefix = keys.queue_prefix(TRANS_CHECK_MAX_TIME_TOPIC, 0)
        for offset in offsets:
            wb.delete(keys.cq_key(prefix, offset), self._h_cq)
        self._queue_start.pop(prefix, None)

    def queue_entries(self, record: Record, half_of) -> list[tuple[bytes, int]]:
        """The (queue prefix, offset) entries a record makes readable; `half_of(lsn)` reads the half
        record a commit indexes."""
        kind = type(record)
        if kind is NormalRecord:
            return [(keys.queue_prefix(m.topic, m.queue_id), o) for m, o in zip(record.messages, record.queue_offsets)]
        if kind is EndRecord and record.queue_offsets:
            half = half_of(record.half_lsn)
            return [(keys.queue_prefix(m.topic, m.queue_id), o) for m, o in zip(half.messages, record.queue_offsets)]
        if kind is ParkRecord:
            return [(keys.queue_prefix(TRANS_CHECK_MAX_TIME_TOPIC, 0), o) for o in record.queue_offsets]
        return []

    # ---- truncation ---------------------------------------------------------------------------------

    def cut(self, dropped, last_kept: int, scratch: "Batch") -> None:
        wb = scratch.wb
        topics: set[str] = set()
        for lsn, r in dropped:
            kind = type(r)
            if kind is NormalRecord:
                self.forget(lsn, r, wb)
            elif kind is EndRecord and r.queue_offsets:  # a commit indexed its messages under the half's LSN
                raw = self._db.log.get(keys.lsn_key(r.half_lsn))
                if raw is not None:  # (else retention deleted it, and its entries with it)
                    self.forget_messages(wb, r.half_lsn, decode_record(raw).messages, r.queue_offsets)
            elif kind is ParkRecord:
                self.forget_parked(wb, r.queue_offsets)
            elif kind is TopicRecord:
                topics.add(r.name)
        if topics:
            for lsn, r in walk_back(self._db, last_kept, lambda r: type(r) is TopicRecord and r.name in topics):
                if r.name in topics:
                    topics.discard(r.name)
                    wb.put(TOPIC_PREFIX + r.name.encode(), _topic_value(r.queue_count, lsn), self._h_meta)
                if not topics:
                    break
            for name in topics:  # created only by dropped records
                wb.delete(TOPIC_PREFIX + name.encode(), self._h_meta)
