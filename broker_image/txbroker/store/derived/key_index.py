"""The key index (lookup by message key: the keys column family), written behind the log.

A keyed message is found by key through an entry per key (topic, key, record LSN, index -> queue
offset). Those entries are not written with the record that makes the message readable (a plain
send, a commit): the record queues its keys here, and they are written afterwards in WriteBatches
of their own, once the loop has had nothing to write for IDLE_S, or at once while MAX_BACKLOG
messages or MARK_LAG records wait. RocketMQ builds its IndexFile the same way, on a dispatch thread
behind its commit log. So the END of a transaction of N keyed messages does O(1) key work on its way
to its answer (a Spark job's million keys no longer stand between its members' ends and its
decision), and the entries go to RocksDB in large batches.

Meta `keyindex/through` W is written in the same WriteBatch as the entries: every record up to W is
indexed. Records leave the queue only once their write succeeded. Recovery queues the records after
W again, from the log (what a kill left unwritten; a commit's keys are read from its half record:
bench/key_index_recovery.py). Where something must see the index whole, it writes the queue first,
a slice at a time: a read by key (a producer finds what it has just committed), retention and
truncation (they never meet a record whose entries are still to come, which they would leave
behind), `drain()` (a backup, a promotion), and a clean stop (an earlier release, which knows no
mark, may open the store after a rollback; a mark above the log's end, which such a release's
truncation leaves, is brought down at the next start).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Callable

from rocksdict import WriteBatch

from txbroker.store import keys
from txbroker.store.db import last_key, sync_write_options
from txbroker.store.derived.family import Family
from txbroker.store.records import EndRecord, NormalRecord, decode_record, keys_of, runs_of

if TYPE_CHECKING:
    from txbroker.store.db import Database
    from txbroker.store.group_commit import Batch

log = logging.getLogger(__name__)

THROUGH_KEY = b"keyindex/through"
IDLE_S = 0.002  # written once no batch was written for this long
# Messages (of keyed records) waiting, past which they are written while the loop is busy (a SLICE
# per iteration). About what a million pending keyed messages held in memory before their END: the
# queue keeps their key lists a little longer, no more.
MAX_BACKLOG = 1_000_000
SLICE = 16_384  # messages per write (whole records): the loop's pause for one, a few milliseconds
# `through` follows the log within about this many records, busy or not: what a start after a crash
# reads again (a big job's END records, one per member, stay within it and wait for an idle loop).
MARK_LAG = 4096


class KeyIndex(Family):
    def __init__(self, db: "Database", on_fatal: Callable[[BaseException], None]):
        self._db = db
        self._h_keys, self._h_meta = db.handles["keys"], db.handles["meta"]
        self._on_fatal = on_fatal
        # (LSN of the record that made them readable, LSN their entries are under, runs, offsets, keys)
        self._backlog: collections.deque[tuple[int, int, list, list, list[str]]] = collections.deque()
        self._entries = 0  # messages of the records in the backlog (backlog_messages)
        self.through = 0  # indexed up to this LSN, as on disk
        self._written_through = 0  # records up to this LSN are on disk (their entries may be written)
        self._last_write = 0.0  # loop time of the last batch written
        self._timer: asyncio.Handle | None = None
        self._urgent = False  # the timer is for now, not for when the loop is idle
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- memory -----------------------------------------------------------------------------------

    def load(self) -> None:
        self.close()
        self._backlog.clear()
        self._entries = 0
        last = last_key(self._db.log)
        log_end = keys.lsn_from_key(last) if last else 0
        self._written_through = log_end
        v = self._db.meta.get(THROUGH_KEY)
        # No mark: a new store, or one a broker that wrote every key with its record left. A mark
        # above the log's end: a broker that knows no mark truncated the log (a rollback, then forward).
        stored = keys.lsn_from_key(v) if v is not None else None
        self.through = log_end if stored is None else min(stored, log_end)
        if self.through != stored:
            self._db.meta.put(THROUGH_KEY, keys.lsn_key(self.through), write_opt=sync_write_options())
        queued = 0
        for k, raw in self._db.log.items(from_key=keys.lsn_key(self.through + 1)):
            r = decode_record(raw)
            kind = type(r)
            if kind is NormalRecord:
                texts = keys_of(r.messages)
                if texts:
                    self.add(keys.lsn_from_key(k), keys.lsn_from_key(k), runs_of(r.messages), r.queue_offsets, texts)
                    queued += 1
            elif kind is EndRecord and r.queue_offsets:  # a commit: its keys are its half's
                half = self._db.log.get(keys.lsn_key(r.half_lsn))
                if half is not None:  # (else retention deleted it, and its messages with it)
                    msgs = decode_record(half).messages
                    texts = keys_of(msgs)
                    if texts:
                        self.add(keys.lsn_from_key(k), r.half_lsn, runs_of(msgs), r.queue_offsets, texts)
                        queued += 1
        if queued:
            log.info("key index: %d records after LSN %d to index again (%d keyed messages)", queued, self.through,
                     self._entries)

    def close(self) -> None:
        """Stop writing (the store is closing, or reloading): no timer is left behind."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._urgent = False

    def backlog_messages(self) -> int:
        """Messages of the records whose keys wait (every message of a record with a key: counted
        without a look at each)."""
        return self._entries

    # ---- queueing ------------------------------------------------------------------------------------

    def add(self, lsn: int, entry_lsn: int, runs, offsets, texts: list[str]) -> None:
        """Record `lsn` makes keyed messages readable (a plain send's own, or a commit's: those of the
        half at `entry_lsn`): their entries are written behind it."""
        self._backlog.append((lsn, entry_lsn, runs, offsets, texts))
        self._entries += len(texts)

    def written(self, b: "Batch") -> None:
        self._written_through = b.last_lsn
        if self._timer is not None:  # a write is due: it waits while batches are being written
            self._last_write = self._loop.time()
            if not self._urgent and self._pressing():  # waiting for an idle loop no longer
                self._soon()
        elif self._backlog:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            self._last_write = loop.time()
            if self._pressing():
                self._soon()
            else:
                self._timer = loop.call_later(IDLE_S, self._tick)
        elif b.last_lsn - self.through >= MARK_LAG:  # no key waits: the mark alone, now
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._soon()

    def _pressing(self) -> bool:
        """Too much waits to wait for an idle loop: memory (MAX_BACKLOG), or the records a start
        after a crash would read again (MARK_LAG)."""
        return self._entries >= MAX_BACKLOG or self._written_through - self.through >= MARK_LAG

    def _soon(self) -> None:
        self.close()
        self._urgent = True
        self._timer = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._urgent = False
        loop = self._loop
        if self._waiting():
            wait = IDLE_S - (loop.time() - self._last_write)
            if wait > 0 and not self._pressing():  # batches are still being written: later
                self._timer = loop.call_later(wait, self._tick)
                return
            limit = SLICE
        else:
            limit = 0  # no key to write: the mark alone follows the log (recovery's scan), busy or not
        try:
            self._write(limit)
        except Exception as e:  # noqa: BLE001 - a failed write stops the broker, as a failed log write does
            log.exception("writing the key index failed; the store stops (the keys waiting are indexed at the "
                          "next start)")
            self._on_fatal(e)
            return
        if self._waiting():
            if self._pressing():
                self._soon()
            else:
                self._timer = loop.call_later(IDLE_S, self._tick)

    def _waiting(self) -> bool:
        """Written records wait for their keys to be written."""
        backlog = self._backlog
        return bool(backlog) and backlog[0][0] <= self._written_through

    def catch_up(self) -> None:
        """Write the entries of every record written so far, at once (a read by key, truncation)."""
        self._write(None)

    async def caught_up(self) -> None:
        """The same, a slice at a time, other work running between slices."""
        while self._write(SLICE):
            await asyncio.sleep(0)

    def _write(self, limit: int | None) -> int:
        """Write the entries of the oldest written records, whole records, up to `limit` messages
        (None: all of them), and move `through` past them in the same WriteBatch. They leave the
        queue only once written: a failed write loses none. Returns how many records it wrote."""
        backlog, written_through = self._backlog, self._written_through
        wb = WriteBatch(raw_mode=True)
        put, h, lsn_key = wb.put, self._h_keys, keys.lsn_key
        n = done = 0
        for lsn, entry_lsn, runs, offsets, texts in backlog:
            if lsn > written_through or (limit is not None and n >= limit):
                break
            for key, i in keys.key_entries(entry_lsn, runs, texts):
                put(key, lsn_key(offsets[i]), h)
            n += len(texts)
            done += 1
        # every record before the oldest still waiting is indexed (those without keys have nothing)
        through = min(backlog[done][0] - 1, written_through) if done < len(backlog) else written_through
        if not done and through <= self.through:
            return 0
        wb.put(THROUGH_KEY, lsn_key(through), self._h_meta)
        self._db.db.write(wb)
        for _ in range(done):
            backlog.popleft()
        self._entries -= n
        self.through = through
        return done

    # ---- retention and truncation ---------------------------------------------------------------------

    def forget_entries(self, wb: "WriteBatch", entry_lsn: int, messages) -> None:
        """Delete the entries of record `entry_lsn`'s keyed messages (retention and truncation, which
        catch up first: none of them is still in the backlog)."""
        texts = keys_of(messages)
        if texts:
            for key, _i in keys.key_entries(entry_lsn, runs_of(messages), texts):
                wb.delete(key, self._h_keys)

    def cut(self, dropped, last_kept: int, scratch: "Batch") -> None:
        """The entries of dropped records go with them (Messages.cut says where they are); what is
        indexed now ends at `last_kept` at most."""
        if self.through > last_kept:
            scratch.wb.put(THROUGH_KEY, keys.lsn_key(last_kept), self._h_meta)
