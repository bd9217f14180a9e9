"""Group commit: many requests' changes go to disk in one RocksDB write.

Changes accumulate in the open batch; it is written at the end of the current loop iteration, on
the loop, with fsync in SYNC flush mode. rocksdict holds the GIL for the whole write, fsync
included, so a writer thread could not overlap it with request handling: the hop there and back
only added latency (bench/broker A/B on a quiet machine, bench/README.md: tx-8p-SYNC 3,096-3,180
tx/s on a writer thread, 4,261-4,546 inline; batch100-8p-SYNC 112-122k msgs/s against 136-137k).
Writing without sync and fsyncing by `flush_wal(True)` on a thread does release the GIL, but with
this host's 0.16 ms fsync it was slower too (bench/README.md, "SYNC flush's fsync on a thread").
Without fsync the WAL reaches the OS, which survives a process kill but not a machine crash.

A failed write is fatal: memory is ahead of disk, so the broker must stop and recover from disk.

Once written, a batch goes to `written(batch)` (the state machine): it decides when the batch is
visible and when its requests are answered, which under SYNC replication waits for the slaves.

Under SYNC flush a batch smaller than the one before it waits a moment for the rest (PostgreSQL's
commit_delay with commit_siblings, MySQL's binlog_group_commit_sync_delay): producers answered
together by one fsync send their next requests a few tens of microseconds apart, and the first to
arrive would otherwise take an fsync of its own while the others queue behind it, batches going 1,
7, 1, 7 for 8 producers. The wait is a loop iteration at a time (the sockets read between, so what
arrives joins the batch), at most half the last fsync's time, and ends once the batch is as large
as the last; a lone producer (batches of 1) never waits.

A batch's future is a DurableFuture: the requests it holds are answered in the call that resolves
it, so their answers leave in the loop iteration of the write, where a done-callback would answer
one iteration later and its answer's write go one more after that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from rocksdict import WriteBatch, WriteOptions

log = logging.getLogger(__name__)

MAX_COMMIT_DELAY = 0.002  # seconds a SYNC batch waits for the rest at most, whatever an fsync took


class DurableFuture(asyncio.Future):
    """A future that also calls `on_resolved(self)` inside set_result/set_exception, in the resolving
    call rather than a loop iteration later (done-callbacks still run as usual), and that cannot be
    cancelled.

    `waiting` belongs to whoever set `on_resolved` (the dispatcher: the requests held until this
    resolves). What `on_resolved` does must not start new work synchronously: it runs inside the
    state's and the replication leader's loops (`answer`)."""

    # Class-level defaults, no __init__ of its own: one is made per batch, by the C constructor alone.
    waiting: list | None = None
    on_resolved: Callable[[DurableFuture], None] | None = None

    def set_result(self, result) -> None:
        super().set_result(result)
        if self.on_resolved is not None:
            self._resolved()

    def set_exception(self, exception) -> None:
        super().set_exception(exception)
        if self.on_resolved is not None:
            self._resolved()

    def cancel(self, msg=None) -> bool:
        """Refused: a batch is shared by its requests and by internal awaiters (a job ending its
        members, an admin reply), so its outcome is the write's. A task awaiting it that is
        cancelled raises CancelledError once the batch resolves; the others are answered as usual."""
        return False

    def _resolved(self) -> None:
        fn, self.on_resolved = self.on_resolved, None
        fn(self)


class Batch:
    __slots__ = ("wb", "future", "visible", "records", "first_lsn", "last_lsn", "raw", "txids", "hold", "opened", "may_wait")

    def __init__(self, future: DurableFuture) -> None:
        self.wb = WriteBatch(raw_mode=True)
        self.future = future
        self.visible: dict[bytes, int] = {}  # queue prefix -> end offset made visible by this batch
        self.records = 0
        self.first_lsn = 0
        self.last_lsn = 0
        self.raw: list[bytes] = []  # the encoded records, in LSN order, for replication
        self.txids: list[str] = []  # transactions finished in this batch
        # The replication hold in force when a record was added (state.py): a batch filled while its
        # broker led is held for the slaves even if the broker stepped down before it was written.
        self.hold: Callable[[Batch], None] | None = None
        self.opened = 0.0  # when its first change came (SYNC flush: how long it has waited for others)
        self.may_wait = True  # SYNC flush: it may wait for others if smaller than the last


class GroupCommit:
    def __init__(self, db, sync: bool, written: Callable[[Batch], None], on_fatal: Callable[[BaseException], None],
                 observe_flush: Callable[[int, float], None] | None = None,
                 before_write: Callable[[Batch], None] | None = None):
        self._db = db
        self._wo = WriteOptions()
        self._wo.sync = sync
        self._written_ok = written
        self._before_write = before_write
        self._on_fatal = on_fatal
        self._observe = observe_flush
        self._open: Batch | None = None
        self._failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync = sync
        self._last_records = 0  # the last batch's records: a smaller one waits for the rest (SYNC)
        self._delay = 0.0  # how long it may wait: half the last write's time

    def batch(self) -> Batch:
        """The open batch, to add changes to; its future resolves when they are durable."""
        b = self._open
        if b is None:
            if self._failed is not None:
                raise RuntimeError("store is stopped after a failed write") from self._failed
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            b = self._open = Batch(DurableFuture(loop=loop))
            if self._sync:
                b.opened = time.perf_counter()
            loop.call_soon(self._flush)
        return b

    def _flush(self) -> None:
        b = self._open
        if b is None:
            return
        if (self._sync and b.may_wait and b.records < self._last_records
                and time.perf_counter() - b.opened < self._delay and self._failed is None):
            self._loop.call_soon(self._flush)  # one more iteration: what the sockets hold joins
            return
        self._open = None
        try:
            self._write(b)
        except Exception as e:  # noqa: BLE001 - any write failure is fatal, handled in _written
            self._written(b, e)
            return
        self._written(b, None)

    def without_wait(self) -> None:
        """The open batch is written at the end of this loop iteration, whatever its size: a slave's
        records are its master's batch, and what else there is comes after its next write."""
        if self._open is not None:
            self._open.may_wait = False

    def abandon(self, b: Batch, error: BaseException) -> None:
        """The open batch `b` cannot be written whole (a record in it failed to apply): nothing of it
        is written, its requests are refused, and the store stops so the broker recovers from disk
        (memory may hold part of that record's effects)."""
        if self._open is b:
            self._open = None
        self._written(b, error, "a record could not be applied: its batch is not written")

    @property
    def open_future(self) -> asyncio.Future | None:
        """The future of the batch still being filled, if one is; raises after a failed write."""
        if self._failed is not None:
            raise RuntimeError("store is stopped after a failed write") from self._failed
        return self._open.future if self._open is not None else None

    def _write(self, b: Batch) -> None:
        if self._before_write is not None:
            self._before_write(b)
        t0 = time.perf_counter()
        self._db.write(b.wb, self._wo)
        took = time.perf_counter() - t0
        if self._sync:
            self._last_records = b.records
            self._delay = min(took * 0.5, MAX_COMMIT_DELAY)
        if self._observe is not None:
            self._observe(b.records, took)

    def _written(self, b: Batch, error: BaseException | None, what: str = "RocksDB write failed") -> None:
        if error is not None:
            self._failed = error
            log.critical("%s; stopping the broker so it recovers from disk", what, exc_info=error)
            answer(b.future, error)
            self._on_fatal(error)
            return
        self._written_ok(b)

    async def drain(self) -> None:
        """Wait until everything added so far is written to the local disk (not replicated)."""
        b = self._open
        while b is not None and self._open is b:  # its write is already scheduled on the loop
            await asyncio.sleep(0)
        if self._failed is not None:
            raise RuntimeError("store is stopped after a failed write") from self._failed


def answer(future: asyncio.Future, error: BaseException | None = None) -> None:
    """Resolve a batch's (or a waiter's) future: the requests waiting on it are answered."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
        future.exception()  # answered through the connection; no "never retrieved" noise
