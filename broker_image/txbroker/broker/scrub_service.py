"""Scrubbing: every record of the store read once, soon after the start and then every
`scrub_interval_ms`, so that a damaged file is found even where no request reads (RocksDB checks a
block's checksum only when it reads the block). What it finds stops the broker as any read would
(Broker.corrupted): nothing damaged is ever served, and a slave is seeded from its master anew.
It reads in slices and yields between them, so requests go on meanwhile."""

from __future__ import annotations

import asyncio
import logging
import time

from txbroker.lifecycle import stop_task
from txbroker.store.db import StoreCorrupt

log = logging.getLogger(__name__)

SLICE = 5_000  # keys read between two yields to the event loop
FIRST_AFTER_S = 5.0


class ScrubService:
    def __init__(self, broker):
        self._b = broker
        self.interval = broker.config.scrub_interval_ms / 1000
        self.last_scrub: dict = {}  # keys read, seconds, when (the admin API shows it)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None and self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="scrub")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        await asyncio.sleep(min(FIRST_AFTER_S, self.interval))
        while True:
            try:
                await self.scrub()
            except StoreCorrupt:  # Broker.corrupted heard of it already (the store's hook)
                return
            except Exception:  # noqa: BLE001 - a failed pass is retried at the next
                log.exception("scrubbing the store failed; trying again in %.0fs", self.interval)
            await asyncio.sleep(self.interval)

    async def scrub(self) -> int:
        """Read every key and value of every column family once; returns how many."""
        t0 = time.perf_counter()
        n = await self._b.state.read_everything(SLICE)
        seconds = time.perf_counter() - t0
        self.last_scrub = {"keys": n, "seconds": round(seconds, 3), "at_ms": int(time.time() * 1000)}
        log.info("scrubbed the store: %d keys read, none damaged, in %.2fs", n, seconds)
        return n
