"""Group commit: many requests' changes go to disk in one RocksDB write.

Changes accumulate in the open batch. With SYNC flush a flush runs the write and its fsync on a
dedicated writer thread (RocksDB releases the GIL), so the event loop keeps taking requests into
the next batch while the disk works: that is what makes a synced broker fast. With ASYNC flush the
batch is written at the end of the current loop iteration, on the loop: without fsync the write is
cheap, and a hop to a thread and back cost more latency than it saved (tx-8p: 5.1k -> 9.4k tx/s).
The WAL then reaches the OS, which survives a process kill but not a machine crash.

A failed write is fatal: memory is ahead of disk, so the broker must stop and recover from disk.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Callable

from rocksdict import WriteBatch, WriteOptions

log = logging.getLogger(__name__)


class Batch:
    __slots__ = ("wb", "future", "visible", "records", "first_lsn", "last_lsn", "raw", "txids", "on_durable")

    def __init__(self, future: asyncio.Future) -> None:
        self.wb = WriteBatch(raw_mode=True)
        self.future = future
        self.visible: dict[bytes, int] = {}  # queue prefix -> end offset made visible by this batch
        self.records = 0
        self.first_lsn = 0
        self.last_lsn = 0
        self.raw: list[bytes] = []  # the encoded records, in LSN order, for replication
        self.txids: list[str] = []  # transactions prepared or finished in this batch
        self.on_durable: list[Callable[[], None]] = []


class GroupCommit:
    def __init__(self, db, sync: bool, on_durable: Callable[[Batch], None],
                 on_fatal: Callable[[BaseException], None], observe_flush: Callable[[int, float], None] | None = None):
        # `hold(batch, complete)`, when set, is told of every locally written batch and calls
        # complete(batch, error) when it may be answered (SYNC replication waits for slaves there).
        self.hold: Callable[[Batch, Callable[[Batch, BaseException | None], None]], None] | None = None
        self._db = db
        self._sync = sync
        self._wo = WriteOptions()
        self._wo.sync = sync
        self._on_durable = on_durable
        self._on_fatal = on_fatal
        self._observe = observe_flush
        self._open: Batch | None = None
        self._flying: Batch | None = None  # the batch being written (SYNC mode)
        self._failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="txbroker-writer")

    def batch(self) -> Batch:
        """The open batch, to add changes to; its future resolves when they are durable."""
        b = self._open
        if b is None:
            if self._failed is not None:
                raise RuntimeError("store is stopped after a failed write") from self._failed
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            b = self._open = Batch(loop.create_future())
            if self._flying is None:
                loop.call_soon(self._flush)
        return b

    def _flush(self) -> None:
        b = self._open
        if b is None or self._flying is not None:
            return
        self._open = None
        if not self._sync:
            # Without fsync the write is a memcpy into the WAL and memtable: doing it here costs
            # less latency than a hop to the writer thread and back (measured: tx-8p).
            try:
                self._write(b)
            except Exception as e:  # noqa: BLE001 - any write failure is fatal, handled in _written
                self._written(b, e)
                return
            self._written(b, None)
            return
        self._flying = b
        fut = self._loop.run_in_executor(self._executor, self._write, b)
        fut.add_done_callback(lambda f, b=b: self._written(b, f.exception()))

    def _write(self, b: Batch) -> None:
        t0 = time.perf_counter()
        self._db.write(b.wb, self._wo)
        if self._observe is not None:
            self._observe(b.records, time.perf_counter() - t0)

    def _written(self, b: Batch, error: BaseException | None) -> None:
        self._flying = None
        if error is not None:
            self._failed = error
            log.critical("RocksDB write failed; stopping the broker so it recovers from disk", exc_info=error)
            if not b.future.done():
                b.future.set_exception(error)
            b.future.exception()  # mark retrieved
            self._on_fatal(error)
            return
        if self.hold is not None:
            self.hold(b, self.complete)
        else:
            self.complete(b, None)
        if self._open is not None:
            self._flush()

    def complete(self, b: Batch, error: BaseException | None) -> None:
        """The batch is durable (and replicated as required): make it visible and answer."""
        self._on_durable(b)
        for cb in b.on_durable:
            cb()
        if b.future.done():
            return
        if error is None:
            b.future.set_result(None)
        else:
            b.future.set_exception(error)
            b.future.exception()  # answered through the connection; no "never retrieved" noise

    async def drain(self) -> None:
        """Wait until everything added so far is durable."""
        for b in (self._flying, self._open):
            if b is not None:
                await asyncio.shield(b.future)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
