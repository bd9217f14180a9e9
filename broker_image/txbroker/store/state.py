"""The broker's durable state: the log, its publication, and the families of state derived from it.

`append(record)` (and its forms that assign queue offsets) is the only way state changes. It writes
the record into the open group-commit batch and has the families that derive from it (store/derived/:
one owner per family, dispatched by record type) write what they derive into the same batch and
update memory at once, so later requests in the same batch see it. A replica applies the records it
receives through the same code, so master and slaves derive identical state. A record whose
derivation fails is never half applied: the batch is not written and the broker stops to recover
from disk (as for a failed write), so the log and what replication ships never part.

Readers see only what is *published* (`visible_end`, `durable_lsn`): written to the local disk and,
on a master under SYNC replication, held by the slaves it needs. A write the slaves do not have is
answered SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT and stays unpublished until they have it, so no
consumer reads what a failover can take away (Kafka's high watermark). Such a master records the
published LSN in every batch (meta `published`); after a restart what lies beyond it is published
again only once a slave has it.

Retention and truncation (retention.py, truncation.py) go through the families too. The rest of
the broker uses the methods of StateMachine, never its RocksDB handles (`db`), its group-commit
writer or the families' internals: those belong to the store package. tests/unit/test_structure.py
holds the broker to that.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Callable

from txbroker.protocol.bodies import Message
from txbroker.store import keys
from txbroker.store import seed
from txbroker.store.db import COLUMN_FAMILIES, Database, last_item_with_prefix, last_key, open_database, sync_write_options
from txbroker.store.derived.family import Family, RetentionPass
from txbroker.store.derived.jobs import JOB_RETENTION_MS, Jobs
from txbroker.store.derived.key_index import KeyIndex
from txbroker.store.derived.marks import MARK_PREFIX, Marks, decode_mark
from txbroker.store.derived.messages import Messages
from txbroker.store.derived.offsets import Offsets
from txbroker.store.derived.settings import Settings
from txbroker.store.derived.transactions import Transactions
from txbroker.store.group_commit import Batch, GroupCommit, answer
from txbroker.store.truncation import truncate
from txbroker.store.records import (
    EpochRecord, FinishedTx, JobState, NormalRecord, OffsetRecord, PendingTx, Record, decode_record, encode,
    runs_of,
)

log = logging.getLogger(__name__)

PUBLISHED_KEY = b"published"
EPOCH_PREFIX = b"epoch/"
SLAVE_RECORD_KEY = b"replication/slaves"
# Past this many unpublished batches (slaves away for long) new ones are merged into the last, so
# memory stays bounded; what is merged is published together.
MAX_UNPUBLISHED = 1024


def _dispatch(tables: list[dict[type, Callable]]) -> dict[type, Callable]:
    """One applier per record type: the family's own, or one calling each family that derives from
    it, in the families' order."""
    by_type: dict[type, list[Callable]] = {}
    for table in tables:
        for kind, fn in table.items():
            by_type.setdefault(kind, []).append(fn)
    out = {}
    for kind, fns in by_type.items():
        if len(fns) == 1:
            out[kind] = fns[0]
        else:
            def each(record, lsn, b, fns=tuple(fns)):
                for fn in fns:
                    fn(record, lsn, b)
            out[kind] = each
    return out


class ApplyError(RuntimeError):
    """A record could not be applied: the batch holding it is not written, and the store stops."""


class StateMachine:
    def __init__(self, path: str, sync_flush: bool, on_fatal: Callable[[BaseException], None],
                 observe_flush: Callable[[int, float], None] | None = None,
                 job_retention_ms: int = JOB_RETENTION_MS):
        t0 = time.perf_counter()
        self.path = path
        self.db: Database = open_database(path)
        self._h_log, self._h_meta = self.db.handles["log"], self.db.handles["meta"]
        self._on_fatal = on_fatal
        self._writer = GroupCommit(self.db.db, sync_flush, self._written_locally, on_fatal, observe_flush,
                                   self._before_write)
        # A SYNC replication leader sets these: `replication_hold(batch)` answers a written batch when
        # the slaves have it (and publishes it through `publish_through`); `replication_wait(lsn)`
        # gives a future for a record written earlier but not yet published.
        self.replication_hold: Callable[[Batch], None] | None = None
        self.replication_wait: Callable[[int], asyncio.Future] | None = None
        # A slave: readers see no further than its master has published (None: all that is written).
        self.publish_limit: int | None = None
        # Written but not yet published, in LSN order: [last LSN, {queue prefix: visible end}].
        self._unpublished: collections.deque[list] = collections.deque()
        self._published_marked = False  # the meta `published` key exists on disk
        self.epochs: list[tuple[int, int]] = []  # (epoch, first LSN of that epoch), ascending
        self.log_bytes = 0  # bytes of log records written, ever (retention's size limit counts these)
        self.log_complete_from = 1  # retention deleted (most) records before this LSN
        self.durable_lsn = 0  # written, and replicated as required: visible to readers
        self.local_durable_lsn = 0  # written to the local disk (what replication can ship)
        self.truncating = False
        self.on_truncate: list[Callable[[], None]] = []  # caches of records to drop after a truncation
        self.on_corruption = self.db.on_corruption  # told of a damaged file a read met (StoreCorrupt follows)

        # the families of derived state, in the order truncation cuts them back
        self.key_index = KeyIndex(self.db, on_fatal)
        self.messages = Messages(self.db, self.key_index)
        self.jobs_family = Jobs(self.db, self.messages, job_retention_ms)
        self.transactions = Transactions(self.db, self.messages, self.jobs_family, self.key_index)
        self.jobs_family.transactions = self.transactions
        self.offsets = Offsets(self.db, lambda: self.durable_lsn)
        self.settings = Settings(self.db)
        self.marks = Marks(self.db)
        self.families: tuple[Family, ...] = (self.messages, self.transactions, self.jobs_family, self.offsets,
                                             self.settings, self.marks, self.key_index)
        self._appliers = _dispatch([{EpochRecord: self._apply_epoch}] + [f.appliers() for f in self.families])
        # the families' state the broker reads directly (live views, never replaced)
        self.topics = self.messages.topics
        self.jobs = self.jobs_family.jobs
        self.job_members = self.jobs_family.job_members
        self.group_settings = self.settings.groups
        self.on_group_settings = self.settings.on_change
        self._recover()
        self.recovery_seconds = time.perf_counter() - t0

    # ---- recovery -------------------------------------------------------------------------------

    def _recover(self) -> None:
        last = last_key(self.db.log)
        # retention may have deleted the last records too (an END, an epoch record): the numbering
        # goes on after them, never at LSNs a slave may hold
        self.next_lsn = max((keys.lsn_from_key(last) + 1) if last else 1, self.marks.complete_from())
        self.durable_lsn = self.local_durable_lsn = self.next_lsn - 1
        self._load_memory()
        self._count_log_bytes()
        published = self.db.meta.get(PUBLISHED_KEY)
        if published is not None:
            self._published_marked = True
            self._hide_unpublished(keys.lsn_from_key(published))
        parked = sum(1 for p in self.pending_transactions() if p.state == "PARKED")
        log.info("recovered store %s: next LSN %d, epoch %d, %d topics, %d pending transactions (%d parked)",
                 self.path, self.next_lsn, self.epoch, len(self.topics), self.pending_count - parked, parked)

    def _count_log_bytes(self) -> None:
        """The byte count retention measures sizes with: the last mark's, plus the records after it."""
        self.log_complete_from = self.marks.complete_from()
        last_mark = last_item_with_prefix(self.db.meta, MARK_PREFIX)
        if last_mark is None:
            return
        mark = decode_mark(last_mark[1])
        self.log_bytes = mark.log_bytes + sum(len(raw) for _k, raw in self.db.log.items(from_key=keys.lsn_key(mark.lsn)))

    def _load_memory(self) -> None:
        """What memory holds of the store (epochs and every family's memory), from disk."""
        self.epochs.clear()
        for k, v in self.db.meta.items(from_key=EPOCH_PREFIX):
            if not k.startswith(EPOCH_PREFIX):
                break
            self.epochs.append((keys.lsn_from_key(k[len(EPOCH_PREFIX):]), int(v)))
        for family in self.families:  # transactions before jobs: a job's members are its pending transactions
            family.load()

    @property
    def epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else 0

    # ---- the master's record of its slaves (broker/replication/slave_record.py), outside the log --

    def slave_record(self) -> bytes | None:
        return self.db.meta.get(SLAVE_RECORD_KEY)

    def keep_slave_record(self, doc: bytes, sync: bool) -> None:
        """`sync`: on disk when this returns (a slave that may acknowledge is never forgotten by a crash)."""
        if sync:
            self.db.meta.put(SLAVE_RECORD_KEY, doc, write_opt=sync_write_options())
        else:
            self.db.meta.put(SLAVE_RECORD_KEY, doc)

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
            record = decode_record(raw)
            if type(record) is OffsetRecord:
                for topic, queue, _offset in record.offsets:
                    offset_writes[keys.offset_key(record.consumer_group, topic, queue)] = lsn
            self._unpublished.append([lsn, self.messages.hide(record, self._record_at)])
            hidden += 1
        self.durable_lsn = published
        self.offsets.hide_writes(offset_writes, published)
        log.warning("%d records after LSN %d were never confirmed by a slave: unreadable until one has them",
                    hidden, published)

    def _record_at(self, lsn: int) -> Record:
        return decode_record(self.db.log[keys.lsn_key(lsn)])

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

    # ---- writing --------------------------------------------------------------------------------

    def append_to_queues(self, runs: list[tuple[str, int, int]], build: Callable[[list[int]], Record]
                         ) -> tuple[int, list[int], asyncio.Future]:
        """Give each message its queue's next offset and append the record that stores them,
        `build(offsets)`, in one step, as RocketMQ's CommitLog assigns offsets as it appends: no
        offset is reserved without its record. `runs`: (topic, queue id, count) of the messages in
        order (records.runs_of). Returns the record's LSN, the offsets, and the batch's durability
        future."""
        offsets = self.messages.reserve(runs)
        lsn = self.next_lsn
        record = build(offsets)
        return lsn, offsets, self._write(lsn, record, encode(record))

    def append_messages(self, now: int, messages: list[Message], send_back: bytes = b""
                        ) -> tuple[int, list[int], asyncio.Future]:
        """Store `messages` visible (a plain send, a retry, a dead letter, a delayed delivery)."""
        return self.append_to_queues(runs_of(messages),
                                     lambda offsets: NormalRecord(now, messages, offsets, send_back))

    def append(self, record: Record) -> tuple[int, asyncio.Future]:
        """Make `record` part of the open batch; returns its LSN and the batch's durability future."""
        lsn = self.next_lsn
        return lsn, self._write(lsn, record, encode(record))

    def apply_replicated(self, lsn: int, raw: bytes) -> asyncio.Future:
        """A slave applies the master's record `lsn` exactly as the master did."""
        if lsn != self.next_lsn:
            raise ValueError(f"replicated record {lsn} does not follow the local log end {self.next_lsn - 1}")
        fut = self._write(lsn, decode_record(raw), raw)
        self._writer.without_wait()
        return fut

    def _write(self, lsn: int, record: Record, raw: bytes) -> asyncio.Future:
        b = self._writer.batch()
        if b.hold is None:
            b.hold = self.replication_hold
        try:
            self._appliers[type(record)](record, lsn, b)
        except Exception as e:  # a bug (or a record this broker cannot follow): never half applied
            failed = ApplyError(f"record {lsn} ({type(record).__name__}) could not be applied: {type(e).__name__}: "
                                f"{e}; the store stops and recovers from disk")
            failed.__cause__ = e
            self._writer.abandon(b, failed)  # logs it, with where it failed
            # The batch's WriteBatch holds column-family handles (and RocksDB's LOCK): no traceback keeps it.
            e.__traceback__ = None
            b = None  # noqa: F841
            raise failed from e
        self.next_lsn = lsn + 1
        b.wb.put(keys.lsn_key(lsn), raw, self._h_log)
        self.log_bytes += len(raw)
        if not b.records:
            b.first_lsn = lsn
        b.records += 1
        b.last_lsn = lsn
        b.raw.append(raw)
        return b.future

    def _apply_epoch(self, r: EpochRecord, lsn: int, b: Batch) -> None:
        self.epochs.append((r.epoch, lsn))
        b.wb.put(EPOCH_PREFIX + keys.lsn_key(r.epoch), str(lsn).encode(), self._h_meta)

    def _before_write(self, b: Batch) -> None:
        if self.replication_wait is not None or self.publish_limit is not None:
            b.wb.put(PUBLISHED_KEY, keys.lsn_key(self.durable_lsn), self._h_meta)
            self._published_marked = True
        elif self._published_marked:  # no longer a SYNC master: everything written is published
            b.wb.delete(PUBLISHED_KEY, self._h_meta)
            self._published_marked = False

    def _written_locally(self, b: Batch) -> None:
        self.local_durable_lsn = b.last_lsn
        for family in self.families:
            family.written(b)
        unpublished = self._unpublished
        if len(unpublished) >= MAX_UNPUBLISHED:
            last = unpublished[-1]
            last[0] = b.last_lsn
            for prefix, end in b.visible.items():
                if last[1].get(prefix, -1) < end:
                    last[1][prefix] = end
        else:
            unpublished.append([b.last_lsn, b.visible])
        hold = b.hold or self.replication_hold
        if hold is not None:
            hold(b)
        else:
            limit = self.publish_limit
            self.publish_through(b.last_lsn if limit is None else min(b.last_lsn, limit))
            answer(b.future)

    # ---- publication ------------------------------------------------------------------------------

    def publish_through(self, lsn: int) -> None:
        """Make what is written up to `lsn` readable, and wake the readers waiting for it."""
        unpublished = self._unpublished
        publish = self.messages.publish
        while unpublished and unpublished[0][0] <= lsn:
            last, visible = unpublished.popleft()
            self.durable_lsn = last
            publish(visible)
        if lsn > self.durable_lsn and lsn <= self.local_durable_lsn:
            self.durable_lsn = lsn
        self.messages.published_through(self.durable_lsn)

    def publish_all(self) -> None:
        """The whole local log is published (this broker leads without SYNC replication, or its
        master confirmed that it holds the same log and published it)."""
        self.publish_limit = None
        self.publish_through(self.local_durable_lsn)

    def follow_published(self, master_published: int) -> None:
        """A slave: its master has published up to `master_published` (-1: a master that does not
        say, which publishes what it writes): readers here see as far, no further."""
        if master_published < 0:
            self.publish_all()
            return
        self.publish_limit = master_published
        self.publish_through(min(master_published, self.local_durable_lsn))

    def published_future(self, lsn: int) -> asyncio.Future | None:
        """None if record `lsn` is published; else a future that resolves when it is (or fails as
        the write that stored it would now). A retried request waits on this before SUCCESS."""
        if lsn <= self.durable_lsn:
            return None
        if lsn > self.local_durable_lsn:
            return self._writer.open_future
        if self.replication_wait is not None:
            return self.replication_wait(lsn)
        return None  # an ASYNC master (it published what it wrote), or a broker that never led

    # ---- retention and truncation (through the families) --------------------------------------------

    def lineage(self) -> list[int]:
        """Every record live state is derived from now, as retention's next mark keeps them."""
        needed: set[int] = set()
        for family in self.families:
            needed.update(family.lineage())
        return sorted(needed)

    def forget(self, lsn: int, record: Record, wb, rp: RetentionPass) -> None:
        """Retention deletes record `lsn`: what it derived goes too (each family says what)."""
        for family in self.families:
            family.forget(lsn, record, wb, rp)

    def expire(self, wb, rp: RetentionPass) -> int:
        return sum(family.expire(wb, rp) for family in self.families)

    def forget_before(self, lsn: int) -> None:
        """Retention deleted what it could before `lsn`."""
        self.log_complete_from = max(self.log_complete_from, lsn)

    async def truncate_after(self, last_kept: int) -> int:
        """Drop the log records after `last_kept` and what was derived from them; see truncation.py.
        Returns how many records were dropped."""
        self.truncating = True
        try:
            await self.drain()  # the key index too: the cut deletes the entries of what it drops
            dropped = truncate(self, last_kept)
        finally:
            self.truncating = False
        self.next_lsn = last_kept + 1
        self.durable_lsn = self.local_durable_lsn = last_kept
        self._unpublished.clear()
        self.offsets.forget_unpublished()
        self._published_marked = False
        self._load_memory()
        for forget in self.on_truncate:
            forget()
        return dropped

    # ---- waiting for visibility (long polling) ----------------------------------------------------

    def wait_visible(self, prefix: bytes) -> asyncio.Future:
        return self.messages.wait_visible(prefix)

    def forget_waiter(self, prefix: bytes, fut: asyncio.Future) -> None:
        self.messages.forget_waiter(prefix, fut)

    # ---- lookups ------------------------------------------------------------------------------------

    def pending_transaction(self, transaction_id: str) -> PendingTx | None:
        """A transaction still prepared or parked."""
        return self.transactions.pending.get(transaction_id)

    def pending_transactions(self):
        """Every transaction still prepared or parked (a live view: do not append while walking it)."""
        return self.transactions.pending.values()

    @property
    def pending_count(self) -> int:
        return len(self.transactions.pending)

    def finished(self, transaction_id: str) -> FinishedTx | None:
        return self.transactions.finished(transaction_id)

    def unreleased_decisions(self) -> dict[str, list[str]]:
        """Spanning transactions decided here whose participants may still ask: txid -> their groups."""
        return self.transactions.unreleased

    def job(self, job_id: str) -> JobState | None:
        return self.jobs_family.job(job_id)

    def unreleased_jobs(self) -> set[str]:
        """Decided jobs spanning groups that some group may still ask about (a live view)."""
        return self.jobs_family.unreleased

    @property
    def newest_spanning_decision(self) -> int:
        """LSN of the newest decision recorded here of a job spanning groups."""
        return self.jobs_family.newest_spanning_decision

    def job_named(self, name: str) -> JobState | None:
        return self.jobs_family.job_named(name)

    def iter_jobs(self):
        return self.jobs_family.iter_jobs()

    def queue_end(self, topic: str, queue_id: int) -> int:
        return self.messages.queue_end(topic, queue_id)

    def readable_end(self, topic: str, queue_id: int) -> int:
        return self.messages.readable_end(topic, queue_id)

    def queue_start(self, topic: str, queue_id: int) -> int:
        return self.messages.queue_start(topic, queue_id)

    def send_back_lsn(self, key: bytes) -> int | None:
        return self.messages.send_back_lsn(key)

    def committed_offset(self, group: str, topic: str, queue_id: int, published: bool = True) -> int | None:
        return self.offsets.committed(group, topic, queue_id, published)

    def offset_written_at(self, group: str, topic: str, queue_id: int) -> int:
        return self.offsets.written_at(group, topic, queue_id)

    def offset_for_reader(self, group: str, topic: str, queue_id: int) -> tuple[int | None, int]:
        return self.offsets.for_reader(group, topic, queue_id)

    def consumer_offsets(self):
        return self.offsets.all_published()

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

    # ---- checking and copying the store ---------------------------------------------------------------

    def sync_log(self) -> None:
        """fsync the write-ahead log (ASYNC flush's periodic sync, broker/wal_sync_service.py)."""
        self.db.db.flush_wal(True)

    async def read_everything(self, slice_keys: int = 5_000) -> int:
        """Every key and value of every column family read once (RocksDB checks each block's checksum
        as it reads it: a damaged file raises StoreCorrupt); yields to the loop every `slice_keys`."""
        n = 0
        for name in COLUMN_FAMILIES:
            for _k, _v in getattr(self.db, name).items():
                n += 1
                if n % slice_keys == 0:
                    await asyncio.sleep(0)
        return n

    def checkpoint(self, snapshot_id: str):
        """A consistent copy of the store (store/seed.py), for a slave to seed itself from."""
        return seed.checkpoint(self.db.db, self.path, snapshot_id)

    # ---- waiting for writes -------------------------------------------------------------------------

    def key_index_lag(self) -> tuple[int, int]:
        """(messages of keyed records whose key-index entries are still to be written, last LSN indexed)."""
        return self.key_index.backlog_messages(), self.key_index.through

    async def drain(self) -> None:
        """Everything appended so far is written to the local disk (not necessarily replicated), the
        key index's entries included."""
        await self._writer.drain()
        await self.key_index.caught_up()

    async def index_keys_now(self) -> None:
        """Every key of what is written so far written to the key index (a slice at a time)."""
        await self.key_index.caught_up()

    def barrier(self) -> asyncio.Future | None:
        """A future that resolves when everything appended so far is durable and published (the
        open batch's, or a wait for the last record written), or fails as that would; None if all
        of it is published already. It never writes an empty batch."""
        pending = self._writer.open_future
        if pending is not None:
            return pending
        return self.published_future(self.local_durable_lsn)

    async def close(self) -> None:
        try:
            await self._writer.drain()
        except RuntimeError:  # stopped after a failed batch: nothing more to write
            pass
        else:
            try:  # the key index whole: an older broker, which knows no backlog, may open this store next
                self.key_index.catch_up()
            except Exception as e:  # noqa: BLE001 - e.g. a full disk: the next start indexes it from the log
                log.warning("store %s: the key index could not be written at the stop (%s); the next start "
                            "indexes what is missing from the log", self.path, e)
        self.key_index.close()
        self.db.close()
        # Column-family handles keep RocksDB (and its LOCK) open until they are gone: the families hold some.
        self._h_log = self._h_meta = None
        self.jobs_family.transactions = None  # the one cycle between families
        self.families = ()
        self._appliers = {}
        self.messages = self.transactions = self.jobs_family = self.offsets = self.settings = self.marks = None
        self.key_index = None
