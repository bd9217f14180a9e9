"""ASYNC flush's periodic fsync. A write under ASYNC flush is answered once RocksDB has it in its
log, in the OS's page cache: a kill -9 loses nothing, a power loss loses what no fsync reached.
Every `flush_interval_ms` (500 ms, RocketMQ's flushIntervalCommitLog) the log is fsynced, so that
loss is at most the writes of one interval; `synced_lsn` (the admin API's `synced_offset`) says
how far it reached. Without it, nothing was fsynced until RocksDB flushed a memtable: a power loss
took every write since, however old (chaos/lazyfs.py found it). SYNC flush fsyncs every batch
before answering it, and needs none of this."""

from __future__ import annotations

import asyncio
import logging
import time

from txbroker.lifecycle import stop_task

log = logging.getLogger(__name__)


class WalSyncService:
    def __init__(self, broker):
        self._b = broker
        self.interval = broker.config.flush_interval_ms / 1000
        self.sync_flush = broker.config.flush_disk_type == "SYNC"
        self._synced = 0
        self.last_sync_seconds = 0.0
        self._task: asyncio.Task | None = None
        self._inflight: asyncio.Future | None = None  # a sync running on its thread

    @property
    def synced_lsn(self) -> int:
        """The last LSN fsynced to the local disk."""
        return self._b.state.local_durable_lsn if self.sync_flush else self._synced

    def start(self) -> None:
        if self._task is None and not self.sync_flush:
            self._synced = self._b.state.local_durable_lsn  # what a restart recovered is on disk
            self._task = asyncio.get_running_loop().create_task(self._run(), name="wal-sync")

    async def stop(self, sync: bool = False) -> None:
        await stop_task(self._task)
        self._task = None
        if self._inflight is not None:  # the store may close next: not under a running fsync
            await asyncio.wait([self._inflight])
        if sync and not self.sync_flush:
            self.sync()  # a clean stop leaves nothing unsynced

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval)
            try:  # on a thread: RocksDB takes writes meanwhile, and an fsync of a busy log may take a while
                written = self._b.state.local_durable_lsn  # group commit writes on the loop: all of it is logged
                if written > self._synced:
                    t0 = time.perf_counter()
                    self._inflight = loop.run_in_executor(None, self._b.state.sync_log)
                    await asyncio.shield(self._inflight)
                    self.last_sync_seconds = time.perf_counter() - t0
                    self._synced = max(self._synced, written)
            except Exception:  # noqa: BLE001 - the next interval tries again; a failed write stops the broker anyway
                log.exception("syncing the log failed; trying again in %.1fs", self.interval)

    def sync(self) -> None:
        written = self._b.state.local_durable_lsn
        if written > self._synced:
            self._b.state.sync_log()
            self._synced = written
