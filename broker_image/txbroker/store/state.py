"""The broker's durable state: recovery, applying log records, and the queue high-water marks.

`append(record)` (and its forms that assign queue offsets) is the only way state changes, group
settings included. It writes the record and everything derived from
it into the open group-commit batch and updates memory at once, so later requests in the same
batch see it. A replica applies the records it receives through the same `apply` code, so master
and slaves derive identical state.

Readers see only what is *published* (`visible_end`, `durable_lsn`): written to the local disk and,
on a master under SYNC replication, held by the slaves it needs. A write the slaves do not have is
answered SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT and stays unpublished until they have it, so no
consumer reads what a failover can take away (Kafka's high watermark). Such a master records the
published LSN in every batch (meta `published`); after a restart what lies beyond it is published
again only once a slave has it.

The rest of the broker uses the methods of StateMachine, never its RocksDB handles (`db`), its
group-commit writer or its pending map: those belong to the store package (reads, truncation,
retention). tests/unit/test_structure.py holds the broker to that.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import time
from typing import Callable

from txbroker.protocol.bodies import Message
from txbroker.protocol.codes import TransactionState
from txbroker.protocol.names import PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, TRANS_CHECK_MAX_TIME_TOPIC
from txbroker.store import keys
from txbroker.store.db import Database, last_item_with_prefix, last_key, open_database
from txbroker.store.group_commit import Batch, GroupCommit, answer
from txbroker.store import retention
from txbroker.store.truncation import truncate
from txbroker.store.records import (
    COMMITTED, PARKED, PREPARED, ROLLED_BACK,
    JOB_ABORTED, JOB_COMMITTED, JOB_PREPARED,
    CheckRecord, EndRecord, EpochRecord, FinishedTx, GroupSettingsRecord, HalfRecord, JobDecisionRecord, JobOpenRecord, JobPrepareRecord,
    JobState, NormalRecord, ParkRecord, PendingTx, Record, OffsetRecord, ResumeRecord, TopicRecord,
    decode_finished, decode_job, decode_pending, decode_record, encode,
)

log = logging.getLogger(__name__)

PUBLISHED_KEY = b"published"
# Past this many unpublished batches (slaves away for long) new ones are merged into the last, so
# memory stays bounded; what is merged is published together.
MAX_UNPUBLISHED = 1024


class StateMachine:
    def __init__(self, path: str, sync_flush: bool, on_fatal: Callable[[BaseException], None],
                 observe_flush: Callable[[int, float], None] | None = None):
        t0 = time.perf_counter()
        self.path = path
        self.db: Database = open_database(path)
        h = self.db.handles
        self._h_log, self._h_cq, self._h_pending, self._h_tx, self._h_meta = (
            h["log"], h["cq"], h["pending"], h["tx"], h["meta"])
        self._h_offsets, self._h_keys, self._h_jobs = h["offsets"], h["keys"], h["jobs"]
        self._writer = GroupCommit(self.db.db, sync_flush, self._written_locally, on_fatal, observe_flush,
                                  self._before_write)
        # A SYNC replication leader sets these: `replication_hold(batch)` answers a written batch when
        # the slaves have it (and publishes it through `publish_through`); `replication_wait(lsn)`
        # gives a future for a record written earlier but not yet published.
        self.replication_hold: Callable[[Batch], None] | None = None
        self.replication_wait: Callable[[int], asyncio.Future] | None = None
        # Written but not yet published, in LSN order: [last LSN, {queue prefix: visible end}].
        self._unpublished: collections.deque[list] = collections.deque()
        self._published_marked = False  # the meta `published` key exists on disk
        self.epochs: list[tuple[int, int]] = []  # (epoch, first LSN of that epoch), ascending
        self.topics: dict[str, int] = {}
        self._pending: dict[str, PendingTx] = {}
        # Producer groups' transaction settings as GroupSettingsRecords set them (each with its
        # "generation"); `on_group_settings` hears of every change (None: all may have changed).
        self.group_settings: dict[str, dict] = {}
        self.on_group_settings: list[Callable[[str | None], None]] = []
        # Coordinated transactions (jobs): the undecided ones, and each job's members still pending.
        self.jobs: dict[str, JobState] = {}
        self.job_members: dict[str, set[str]] = {}
        self._jobs_writing: dict[bytes, JobState | str] = {}  # jobs-family entries of the unwritten batch
        self._queue_end: dict[bytes, int] = {}  # next offset to assign, per queue prefix
        self.visible_end: dict[bytes, int] = {}  # offsets below this are durable and readable
        self._waiters: dict[bytes, list[asyncio.Future]] = {}
        # Transactions finished by the batch not yet on disk: the outcome the tx column family will hold.
        self._finishing: dict[str, FinishedTx] = {}
        self._unwritten_send_backs: dict[bytes, int] = {}  # likewise, send-backs: key -> LSN
        # consumer offsets written but not published: key -> (the value readers see, last write's LSN)
        self._offsets_unpublished: dict[bytes, tuple[int | None, int]] = {}
        # after a restart, consumer offsets the unconfirmed tail wrote: key -> its last write's LSN
        self._offsets_unconfirmed: dict[bytes, int] = {}
        self.next_lsn = 1
        self.log_bytes = 0  # bytes of records written, counted from the first retention mark (retention.py)
        self.log_complete_from = 1  # retention deleted records before this LSN (some needed ones stay)
        self._queue_start: dict[bytes, int] = {}  # first offset still stored, per queue prefix
        self.durable_lsn = 0  # written, and replicated as required: visible to readers
        self.local_durable_lsn = 0  # written to the local disk (what replication can ship)
        self.truncating = False
        self.on_truncate: list[Callable[[], None]] = []  # caches of records to drop after a truncation
        self._recover()
        self.recovery_seconds = time.perf_counter() - t0

    # ---- recovery -------------------------------------------------------------------------

    def _recover(self) -> None:
        last = last_key(self.db.log)
        self.next_lsn = (keys.lsn_from_key(last) + 1) if last else 1
        self.durable_lsn = self.local_durable_lsn = self.next_lsn - 1
        self._load_memory()
        self._count_log_bytes()
        published = self.db.meta.get(PUBLISHED_KEY)
        if published is not None:
            self._published_marked = True
            self._hide_unpublished(keys.lsn_from_key(published))
        parked = sum(1 for p in self._pending.values() if p.state == PARKED)
        log.info("recovered store %s: next LSN %d, epoch %d, %d topics, %d pending transactions (%d parked)",
                 self.path, self.next_lsn, self.epoch, len(self.topics), len(self._pending) - parked, parked)

    def _count_log_bytes(self) -> None:
        """The byte count retention measures sizes with: the last mark's, plus the records after it."""
        last_mark = last_item_with_prefix(self.db.meta, retention.MARK_PREFIX)
        if last_mark is None:
            return
        mark = retention.decode_mark(last_mark[1])
        self.log_bytes = mark.log_bytes + sum(len(raw) for _k, raw in self.db.log.items(from_key=keys.lsn_key(mark.lsn)))
        complete = self.db.meta.get(retention.COMPLETE_KEY)
        self.log_complete_from = keys.lsn_from_key(complete) if complete is not None else 1

    def _load_memory(self) -> None:
        """What memory holds of the store (epochs, topics, pending transactions, queue ends), from disk."""
        self.epochs.clear()
        self.topics.clear()
        self._pending.clear()
        self._queue_end.clear()
        self.visible_end.clear()
        self._queue_start.clear()
        for k, v in self.db.meta.items(from_key=b"epoch/"):
            if not k.startswith(b"epoch/"):
                break
            self.epochs.append((keys.lsn_from_key(k[6:]), int(v)))
        for k, v in self.db.meta.items(from_key=b"topic/"):
            if not k.startswith(b"topic/"):
                break
            self.topics[k[6:].decode()] = int(v)
        self.group_settings.clear()
        for k, v in self.db.meta.items(from_key=keys.GROUP_SETTINGS_PREFIX):
            if not k.startswith(keys.GROUP_SETTINGS_PREFIX):
                break
            self.group_settings[k[len(keys.GROUP_SETTINGS_PREFIX):].decode()] = json.loads(v)
        self.jobs.clear()
        self.job_members.clear()
        self._jobs_writing.clear()
        for _k, v in self.db.pending.items():
            p = decode_pending(v)
            self._pending[p.transaction_id] = p
            if p.job_id:
                self.job_members.setdefault(p.job_id, set()).add(p.transaction_id)
        for k, v in self.db.jobs.items(from_key=keys.JOB_ID_PREFIX):
            if not k.startswith(keys.JOB_ID_PREFIX):
                break
            j = decode_job(v)
            if not j.decided:
                self.jobs[j.job_id] = j
                self.job_members.setdefault(j.job_id, set())
        for topic, count in list(self.topics.items()) + [(TRANS_CHECK_MAX_TIME_TOPIC, 1)]:
            for q in range(count):
                self._load_queue_end(keys.queue_prefix(topic, q))

    @property
    def epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else 0

    def epoch_end(self, epoch: int) -> int:
        """Last LSN written at `epoch` or before (the log end if no later epoch exists)."""
        for e, start in self.epochs:
            if e > epoch:
                return start - 1
        return self.next_lsn - 1

    def _hide_unpublished(self, published: int) -> None:
        """After a restart: records beyond the recorded `published` LSN stay unreadable until a
        slave has them (or the broker learns its log is shared, see `publish_all`)."""
        if published >= self.durable_lsn:
            return
        hidden = 0
        offset_writes: dict[bytes, int] = {}  # consumer offsets the hidden records set: key -> last LSN
        for k, raw in self.db.log.items(from_key=keys.lsn_key(published + 1)):
            lsn = keys.lsn_from_key(k)
            ends: dict[bytes, int] = {}
            record = decode_record(raw)
            if type(record) is OffsetRecord:
                for topic, queue, _offset in record.offsets:
                    offset_writes[keys.offset_key(record.consumer_group, topic, queue)] = lsn
            for prefix, offset in self._queue_entries(record):
                if self._queue_end.get(prefix) is None:
                    self._load_queue_end(prefix)
                if offset < self.visible_end[prefix]:
                    self.visible_end[prefix] = offset
                ends[prefix] = max(ends.get(prefix, 0), offset + 1)
            self._unpublished.append([lsn, ends])
            hidden += 1
        self.durable_lsn = published
        self._shadow_offsets(offset_writes, published)
        log.warning("%d records after LSN %d were never confirmed by a slave: unreadable until one has them",
                    hidden, published)

    def _shadow_offsets(self, writes: dict[bytes, int], published: int) -> None:
        """Consumer offsets the unconfirmed tail wrote are answered to nobody until a slave has them.
        Whether readers saw them before the kill is unknown: the published LSN is recorded with each
        write, and slaves may have confirmed more after the last one (the fault harness, seed 19:
        read as of the recorded LSN, an offset read 10 lower than just before the kill; read as
        stored, one no slave held, which a failover then took away)."""
        self._offsets_unconfirmed.update((k, lsn) for k, lsn in writes.items() if lsn > published)

    def forget_messages(self, wb, lsn: int, messages, offsets) -> set[bytes]:
        """Put into `wb` the deletion of what made record `lsn`'s messages readable at `offsets`: their
        queue-index and key-index entries (truncation and retention). Returns the queues touched."""
        touched = set()
        for m, offset in zip(messages, offsets):
            prefix = keys.queue_prefix(m.topic, m.queue_id)
            wb.delete(keys.cq_key(prefix, offset), self._h_cq)
            touched.add(prefix)
        keyed = [(i, m.keys) for i, m in enumerate(messages) if m.keys]
        for key, _i in keys.key_entries(lsn, [(m.topic, m.queue_id) for m in messages], keyed):
            wb.delete(key, self._h_keys)
        return touched

    def _queue_entries(self, record: Record) -> list[tuple[bytes, int]]:
        """The (queue prefix, offset) entries a record makes readable."""
        kind = type(record)
        if kind is NormalRecord:
            return [(keys.queue_prefix(m.topic, m.queue_id), o) for m, o in zip(record.messages, record.queue_offsets)]
        if kind is EndRecord and record.queue_offsets:
            half = decode_record(self.db.log[keys.lsn_key(record.half_lsn)])
            return [(keys.queue_prefix(m.topic, m.queue_id), o) for m, o in zip(half.messages, record.queue_offsets)]
        if kind is ParkRecord:
            return [(keys.queue_prefix(TRANS_CHECK_MAX_TIME_TOPIC, 0), o) for o in record.queue_offsets]
        return []

    def shared_end(self, their_epochs: list[tuple[int, int]], their_last: int) -> int:
        """The last LSN up to which another broker's log (its epochs and last LSN) equals ours.

        Epoch numbers are never reused, so two logs that hold epoch E beginning at the same LSN
        hold the same records of E as far as both go; past the last such epoch they differ."""
        ours = dict(self.epochs)
        for i in range(len(their_epochs) - 1, -1, -1):
            epoch, start = their_epochs[i]
            if ours.get(epoch) == start:
                their_end = their_epochs[i + 1][1] - 1 if i + 1 < len(their_epochs) else their_last
                return min(self.epoch_end(epoch), their_end)
        return 0

    def _load_queue_end(self, prefix: bytes) -> int:
        last = last_item_with_prefix(self.db.cq, prefix)
        end = keys.cq_offset(last[0]) + keys.cq_run_decode(last[1])[2] if last else 0
        self._queue_end[prefix] = end
        self.visible_end[prefix] = end
        return end

    # ---- writing --------------------------------------------------------------------------

    def append_to_queues(self, queues: list[tuple[str, int]], build: Callable[[list[int]], Record]
                         ) -> tuple[int, list[int], asyncio.Future]:
        """Give each message its queue's next offset and append the record that stores them,
        `build(offsets)`, in one step, as RocketMQ's CommitLog assigns offsets as it appends: no
        offset is reserved without its record. `queues`: (topic, queue id) per message. Returns the
        record's LSN, the offsets, and the batch's durability future."""
        ends = self._queue_end
        offsets: list[int] = []
        for dest, run in itertools.groupby(queues):  # consecutive messages to one queue: one lookup
            prefix = keys.queue_prefix(*dest)
            start = ends.get(prefix)
            if start is None:
                start = self._load_queue_end(prefix)
            n = len(list(run))
            ends[prefix] = start + n
            offsets.extend(range(start, start + n))
        lsn = self.next_lsn
        record = build(offsets)
        return lsn, offsets, self._write(lsn, record, encode(record))

    def append_messages(self, now: int, messages: list[Message], send_back: bytes = b""
                        ) -> tuple[int, list[int], asyncio.Future]:
        """Store `messages` visible (a plain send, a retry, a dead letter, a delayed delivery)."""
        return self.append_to_queues([(m.topic, m.queue_id) for m in messages],
                                     lambda offsets: NormalRecord(now, messages, offsets, send_back))

    def append(self, record: Record) -> tuple[int, asyncio.Future]:
        """Make `record` part of the open batch; returns its LSN and the batch's durability future."""
        lsn = self.next_lsn
        return lsn, self._write(lsn, record, encode(record))

    def apply_replicated(self, lsn: int, raw: bytes) -> asyncio.Future:
        """A slave applies the master's record `lsn` exactly as the master did."""
        if lsn != self.next_lsn:
            raise ValueError(f"replicated record {lsn} does not follow the local log end {self.next_lsn - 1}")
        return self._write(lsn, decode_record(raw), raw)

    def _write(self, lsn: int, record: Record, raw: bytes) -> asyncio.Future:
        b = self._writer.batch()
        self.next_lsn = lsn + 1
        b.wb.put(keys.lsn_key(lsn), raw, self._h_log)
        self.log_bytes += len(raw)
        self._apply(record, lsn, b)
        if not b.records:
            b.first_lsn = lsn
        b.records += 1
        b.last_lsn = lsn
        b.raw.append(raw)
        return b.future

    def _before_write(self, b: Batch) -> None:
        if self.replication_wait is not None:
            b.wb.put(PUBLISHED_KEY, keys.lsn_key(self.durable_lsn), self._h_meta)
            self._published_marked = True
        elif self._published_marked:  # no longer a SYNC master: everything written is published
            b.wb.delete(PUBLISHED_KEY, self._h_meta)
            self._published_marked = False

    def _written_locally(self, b: Batch) -> None:
        self.local_durable_lsn = b.last_lsn
        finishing = self._finishing
        for txid in b.txids:  # now in the tx column family
            finishing.pop(txid, None)
        if self._unwritten_send_backs:
            self._unwritten_send_backs.clear()
        if self._jobs_writing:  # written synchronously: nothing of a later batch is in it yet
            self._jobs_writing.clear()
        unpublished = self._unpublished
        if len(unpublished) >= MAX_UNPUBLISHED:
            last = unpublished[-1]
            last[0] = b.last_lsn
            for prefix, end in b.visible.items():
                if last[1].get(prefix, -1) < end:
                    last[1][prefix] = end
        else:
            unpublished.append([b.last_lsn, b.visible])
        if self.replication_hold is not None:
            self.replication_hold(b)
        else:
            self.publish_through(b.last_lsn)
            answer(b.future)

    def _apply(self, record: Record, lsn: int, b: Batch) -> None:
        kind = type(record)
        if kind is HalfRecord:
            self._apply_half(record, lsn, b)
        elif kind is EndRecord:
            self._apply_end(record, lsn, b)
        elif kind is NormalRecord:
            msgs = record.messages
            self._index(b, lsn, [(m.topic, m.queue_id) for m in msgs], record.queue_offsets)
            keyed = [(i, m.keys) for i, m in enumerate(msgs) if m.keys]
            if keyed:
                self._index_keys(b, lsn, [(m.topic, m.queue_id) for m in msgs], record.queue_offsets, keyed)
            if record.send_back:
                b.wb.put(record.send_back, keys.lsn_key(lsn), self._h_meta)
                self._unwritten_send_backs[record.send_back] = lsn
        elif kind is OffsetRecord:
            put = b.wb.put
            shadow = self._offsets_unpublished
            for topic, queue, offset in record.offsets:
                k = keys.offset_key(record.consumer_group, topic, queue)
                before = shadow.get(k)
                # readers keep the value from before the first write of this key not yet published
                shadow[k] = (before[0] if before and before[1] > self.durable_lsn else self._stored_offset(k), lsn)
                put(k, keys.lsn_key(offset), self._h_offsets)
        elif kind is CheckRecord:
            for txid in record.transaction_ids:
                p = self._pending[txid]
                p.checks += 1
                p.last_check_ms = record.check_ms
                b.wb.put(txid.encode(), encode(p), self._h_pending)
        elif kind is ParkRecord:
            p = self._pending[record.transaction_id]
            p.state = PARKED
            p.last_check_ms = record.park_ms
            b.wb.put(p.transaction_id.encode(), encode(p), self._h_pending)
            self._index(b, p.half_lsn, [(TRANS_CHECK_MAX_TIME_TOPIC, 0)] * len(p.destinations), record.queue_offsets)
        elif kind is ResumeRecord:
            p = self._pending[record.transaction_id]
            p.state = PREPARED
            p.checks = 0
            p.last_check_ms = record.resume_ms
            b.wb.put(p.transaction_id.encode(), encode(p), self._h_pending)
        elif kind is TopicRecord:
            self.topics[record.name] = record.queue_count
            b.wb.put(b"topic/" + record.name.encode(), str(record.queue_count).encode(), self._h_meta)
        elif kind is GroupSettingsRecord:
            self._apply_group_settings(record, b.wb)
        elif kind is EpochRecord:
            self.epochs.append((record.epoch, lsn))
            b.wb.put(b"epoch/" + keys.lsn_key(record.epoch), str(lsn).encode(), self._h_meta)
        elif kind is JobOpenRecord:
            j = JobState(record.job_id, record.producer_group, record.open_ms, record.deadline_ms, lsn, record.name)
            self.jobs[j.job_id] = j
            self.job_members.setdefault(j.job_id, set())
            self._put_job(b, j)
            if j.name:
                key = keys.JOB_NAME_PREFIX + j.name.encode()
                b.wb.put(key, j.job_id.encode(), self._h_jobs)
                self._jobs_writing[key] = j.job_id
        elif kind is JobPrepareRecord:
            j = self.job(record.job_id)
            j.state = JOB_PREPARED
            j.members = record.members
            self._put_job(b, j)
        elif kind is JobDecisionRecord:
            j = self.job(record.job_id)
            self.jobs.pop(j.job_id, None)
            j.state = JOB_COMMITTED if record.state == TransactionState.COMMIT else JOB_ABORTED
            j.members = record.members
            j.decided_ms, j.by, j.decision_lsn = record.decided_ms, record.by, lsn
            self._put_job(b, j)
            if not self.job_members.get(j.job_id):
                self.job_members.pop(j.job_id, None)
        else:  # pragma: no cover - the Record union is closed
            raise TypeError(f"unknown record {kind.__name__}")

    def _apply_group_settings(self, r: GroupSettingsRecord, wb) -> None:
        key = keys.group_settings_key(r.group)
        if r.settings:
            doc = {**r.settings, "generation": r.generation}
            self.group_settings[r.group] = doc
            wb.put(key, json.dumps(doc).encode(), self._h_meta)
        else:
            self.group_settings.pop(r.group, None)
            wb.delete(key, self._h_meta)
        for fn in self.on_group_settings:
            fn(r.group)

    def _put_job(self, b: Batch, j: JobState) -> None:
        key = keys.JOB_ID_PREFIX + j.job_id.encode()
        b.wb.put(key, encode(j), self._h_jobs)
        self._jobs_writing[key] = j

    def job(self, job_id: str) -> JobState | None:
        """A job in any state (undecided ones from memory)."""
        j = self.jobs.get(job_id)
        if j is not None:
            return j
        key = keys.JOB_ID_PREFIX + job_id.encode()
        j = self._jobs_writing.get(key)
        if j is not None:
            return j
        v = self.db.jobs.get(key)
        return decode_job(v) if v is not None else None

    def job_named(self, name: str) -> JobState | None:
        """The newest job opened under `name`."""
        key = keys.JOB_NAME_PREFIX + name.encode()
        job_id = self._jobs_writing.get(key)
        if job_id is None:
            v = self.db.jobs.get(key)
            job_id = v.decode() if v is not None else None
        return self.job(job_id) if job_id is not None else None

    def iter_jobs(self):
        """Every job, oldest id first (decided ones from disk: the admin plane's listing)."""
        for k, v in self.db.jobs.items(from_key=keys.JOB_ID_PREFIX):
            if not k.startswith(keys.JOB_ID_PREFIX):
                break
            job_id = k[len(keys.JOB_ID_PREFIX):].decode()
            yield self.jobs.get(job_id) or self._jobs_writing.get(k) or decode_job(v)

    def _apply_half(self, r: HalfRecord, lsn: int, b: Batch) -> None:
        first = r.messages[0].properties
        immunity = first.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        p = PendingTx(
            transaction_id=r.transaction_id, producer_group=r.producer_group, half_lsn=lsn,
            born_ms=r.born_ms, destinations=[(m.topic, m.queue_id) for m in r.messages],
            immunity_ms=int(float(immunity) * 1000) if immunity else 0,
            keyed=[(i, m.keys) for i, m in enumerate(r.messages) if m.keys], job_id=r.job_id, home=r.home,
        )
        if r.job_id:
            self.job_members.setdefault(r.job_id, set()).add(r.transaction_id)
        self._pending[r.transaction_id] = p
        b.wb.put(r.transaction_id.encode(), encode(p), self._h_pending)

    def _apply_end(self, r: EndRecord, lsn: int, b: Batch) -> None:
        p = self._pending.pop(r.transaction_id)
        tid = r.transaction_id.encode()
        b.wb.delete(tid, self._h_pending)
        committed = r.state == TransactionState.COMMIT
        if committed:
            self._index(b, p.half_lsn, p.destinations, r.queue_offsets)
            if p.keyed:
                self._index_keys(b, p.half_lsn, p.destinations, r.queue_offsets, p.keyed)
        done = FinishedTx(
            transaction_id=r.transaction_id, producer_group=p.producer_group, half_lsn=p.half_lsn,
            state=COMMITTED if committed else ROLLED_BACK, end_lsn=lsn, end_ms=r.end_ms,
            message_count=len(p.destinations), queue_offsets=r.queue_offsets, by=r.by, checks=p.checks,
            job_id=p.job_id,
        )
        if p.job_id:
            members = self.job_members.get(p.job_id)
            if members is not None:
                members.discard(r.transaction_id)
                if not members and p.job_id not in self.jobs:  # decided, and every member ended
                    del self.job_members[p.job_id]
        b.wb.put(tid, encode(done), self._h_tx)
        self._finishing[r.transaction_id] = done
        b.txids.append(r.transaction_id)

    def _index(self, b: Batch, lsn: int, destinations, offsets) -> None:
        """Queue-index entries for the messages of record `lsn` (becoming visible when durable):
        one per run of consecutive messages bound for one queue at consecutive offsets."""
        put = b.wb.put
        h = self._h_cq
        lsn_key, run_value = keys.lsn_key, keys.cq_run_value
        visible, queue_end = b.visible, self._queue_end
        i = 0
        for dest, group in itertools.groupby(destinations):
            n = len(list(group))
            prefix = keys.queue_prefix(*dest)
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

    def _index_keys(self, b: Batch, lsn: int, destinations, offsets, keyed) -> None:
        """Key-index entries (lookup by message key) for the keyed messages of a visible record."""
        put, h, lsn_key = b.wb.put, self._h_keys, keys.lsn_key
        for key, i in keys.key_entries(lsn, destinations, keyed):
            put(key, lsn_key(offsets[i]), h)

    def send_back_lsn(self, key: bytes) -> int | None:
        """Where the send-back `key` was stored, if it was."""
        lsn = self._unwritten_send_backs.get(key)
        if lsn is not None:
            return lsn
        v = self.db.meta.get(key)
        return keys.lsn_from_key(v) if v is not None else None

    def queue_start(self, topic: str, queue_id: int) -> int:
        """The first offset of a queue still stored (retention deletes from the front)."""
        prefix = keys.queue_prefix(topic, queue_id)
        start = self._queue_start.get(prefix)
        if start is None:
            it = self.db.cq.iter()
            it.seek(prefix)
            if not (it.valid() and it.key().startswith(prefix)):
                # Nothing stored: what is published was deleted, what is not may not be written yet (the
                # fault harness, seeds 465 and 471: a pull between a queue's first commit and its write
                # cached the reserved end as the start, and the group skipped those messages). Not cached.
                return self.readable_end(topic, queue_id)
            start = self._queue_start[prefix] = keys.cq_offset(it.key())
        return start

    def forget_before(self, lsn: int, queues: set[bytes]) -> None:
        """Retention deleted what it could before `lsn`: queue starts of `queues` moved."""
        self.log_complete_from = max(self.log_complete_from, lsn)
        for prefix in queues:
            self._queue_start.pop(prefix, None)

    def readable_end(self, topic: str, queue_id: int) -> int:
        """Offsets below this are published: readers may see them."""
        prefix = keys.queue_prefix(topic, queue_id)
        end = self.visible_end.get(prefix)
        if end is None:
            self.queue_end(topic, queue_id)
            end = self.visible_end.get(prefix, 0)
        return end

    def committed_offset(self, group: str, topic: str, queue_id: int, published: bool = True) -> int | None:
        """The group's offset as published: a commit the slaves do not hold yet (unacknowledged under
        SYNC replication, and a failover can take it away) is not read, so no reader sees an offset
        that later moves backwards. `published=False`: as written (the broker's own progress, which
        goes on from its own unpublished writes). Readers ask `offset_for_reader`."""
        k = keys.offset_key(group, topic, queue_id)
        shadow = self._offsets_unpublished.get(k) if published else None
        if shadow is not None:
            if shadow[1] > self.durable_lsn:
                return shadow[0]
            del self._offsets_unpublished[k]
        return self._stored_offset(k)

    def offset_for_reader(self, group: str, topic: str, queue_id: int) -> tuple[int | None, int]:
        """The group's offset for a reader, and the LSN its answer must wait for to be published (0:
        none). That is an offset a restart left unconfirmed (`_shadow_offsets`): answered as stored,
        once a slave holds it."""
        k = keys.offset_key(group, topic, queue_id)
        unsure = self._offsets_unconfirmed.get(k)
        if unsure is not None:
            if unsure > self.durable_lsn:
                shadow = self._offsets_unpublished.get(k)
                return self._stored_offset(k), max(unsure, shadow[1] if shadow is not None else 0)
            del self._offsets_unconfirmed[k]
        return self.committed_offset(group, topic, queue_id), 0

    def consumer_offsets(self):
        """(group, topic, queue id, offset) of every committed consumer offset, as published (what
        committed_offset answers): the metrics' consumer lag, read when Prometheus scrapes."""
        out = []
        for k, v in self.db.offsets.items():
            group, _, rest = k.partition(b"\x00")
            shadow = self._offsets_unpublished.get(k)
            offset = shadow[0] if shadow is not None and shadow[1] > self.durable_lsn else keys.lsn_from_key(v)
            if offset is None:
                continue
            out.append((group.decode(), rest[:-3].decode(), keys.queue_id_of(rest[-2:]), offset))
        return out

    def _stored_offset(self, k: bytes) -> int | None:
        v = self.db.offsets.get(k)
        return keys.lsn_from_key(v) if v is not None else None

    def publish_through(self, lsn: int) -> None:
        """Make what is written up to `lsn` readable, and wake the readers waiting for it."""
        unpublished = self._unpublished
        visible_end = self.visible_end
        waiters = self._waiters
        while unpublished and unpublished[0][0] <= lsn:
            last, visible = unpublished.popleft()
            self.durable_lsn = last
            for prefix, end in visible.items():
                if visible_end.get(prefix, 0) < end:
                    visible_end[prefix] = end
                ws = waiters.pop(prefix, None)
                if ws:
                    for w in ws:
                        if not w.done():
                            w.set_result(None)
        if lsn > self.durable_lsn and lsn <= self.local_durable_lsn:
            self.durable_lsn = lsn

    def publish_all(self) -> None:
        """The whole local log is published (this broker leads without SYNC replication, or its
        master confirmed that it holds the same log)."""
        self.publish_through(self.local_durable_lsn)

    def published_future(self, lsn: int) -> asyncio.Future | None:
        """None if record `lsn` is published; else a future that resolves when it is (or fails as
        the write that stored it would now). A retried request waits on this before SUCCESS."""
        if lsn <= self.durable_lsn:
            return None
        if lsn > self.local_durable_lsn:
            return self._writer.open_future
        if self.replication_wait is not None:
            return self.replication_wait(lsn)
        return None  # not leading: the request was refused before it got here

    # ---- truncation (a returning old master rejoins as a slave) ------------------------------

    async def truncate_after(self, last_kept: int) -> int:
        """Drop the log records after `last_kept` and what was derived from them; see truncation.py.
        Returns how many records were dropped."""
        self.truncating = True
        try:
            await self._writer.drain()
            dropped = truncate(self, last_kept)
        finally:
            self.truncating = False
        self.next_lsn = last_kept + 1
        self.durable_lsn = self.local_durable_lsn = last_kept
        self._unpublished.clear()
        self._offsets_unpublished.clear()
        self._offsets_unconfirmed.clear()
        self._finishing.clear()
        self._unwritten_send_backs.clear()
        self._published_marked = False
        self._load_memory()
        for forget in self.on_truncate:
            forget()
        for fn in self.on_group_settings:
            fn(None)
        return dropped

    # ---- waiting for visibility (long polling) -------------------------------------------------

    def wait_visible(self, prefix: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(prefix, []).append(fut)
        return fut

    def forget_waiter(self, prefix: bytes, fut: asyncio.Future) -> None:
        ws = self._waiters.get(prefix)
        if ws and fut in ws:
            ws.remove(fut)

    # ---- lookups ---------------------------------------------------------------------------

    def pending_transaction(self, transaction_id: str) -> PendingTx | None:
        """A transaction still prepared or parked."""
        return self._pending.get(transaction_id)

    def pending_transactions(self):
        """Every transaction still prepared or parked (a live view: do not append while walking it)."""
        return self._pending.values()

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def log_records(self, first: int, last: int, max_records: int, max_bytes: int) -> list[bytes]:
        """The raw records from LSN `first` up to `last`, at most `max_records` or about `max_bytes`
        (at least one): what replication ships to a slave catching up."""
        out: list[bytes] = []
        size = 0
        for k, raw in self.db.log.items(from_key=keys.lsn_key(first)):
            if keys.lsn_from_key(k) > last:
                break
            out.append(raw)
            size += len(raw)
            if len(out) >= max_records or size >= max_bytes:
                break
        return out

    # ---- waiting for writes ------------------------------------------------------------------

    async def drain(self) -> None:
        """Everything appended so far is written to the local disk (not necessarily replicated)."""
        await self._writer.drain()

    def barrier(self) -> asyncio.Future:
        """A future that resolves when everything appended so far is durable and published (as
        the batch it joins is), or fails as that batch's write would."""
        return self._writer.batch().future

    def finished(self, transaction_id: str) -> FinishedTx | None:
        f = self._finishing.get(transaction_id)
        if f is not None:
            return f
        v = self.db.tx.get(transaction_id.encode())
        return decode_finished(v) if v is not None else None

    def queue_end(self, topic: str, queue_id: int) -> int:
        """Next offset to assign (master's view, may be ahead of what is durable)."""
        prefix = keys.queue_prefix(topic, queue_id)
        end = self._queue_end.get(prefix)
        return end if end is not None else self._load_queue_end(prefix)

    async def close(self) -> None:
        await self._writer.drain()
        self.db.close()
        # Column-family handles keep RocksDB (and its LOCK) open until they are gone.
        self._h_log = self._h_cq = self._h_pending = self._h_tx = self._h_meta = None
        self._h_offsets = self._h_keys = self._h_jobs = None
