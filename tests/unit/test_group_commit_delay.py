"""Group commit under SYNC flush (store/group_commit.py): a batch smaller than the last waits, a loop
iteration at a time and at most half the last fsync's time, for the requests still on their way,
and goes as soon as it is as large as the last; a lone producer's batches never wait, nor does
a slave's, nor anything under ASYNC flush. The database is a stand-in whose write takes 1 ms of a clock the test
moves: what is checked is which records share a write."""

from __future__ import annotations

import asyncio
import types

import pytest

from txbroker.store import group_commit


class Clock:
    def __init__(self):
        self.now = 50.0

    def perf_counter(self):
        return self.now


class Disk:
    """Each write takes `seconds` (an fsync; 1 ms) and records how many records it carried."""

    def __init__(self, clock: Clock, batches: list, seconds: float = 0.001):
        self.clock, self.writes, self._batches, self.seconds = clock, [], batches, seconds

    def write(self, wb, wo):
        self.clock.now += self.seconds
        self.writes.append(self._batches.pop(0).records)


async def _iterations(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(group_commit, "time", types.SimpleNamespace(perf_counter=c.perf_counter))
    return c


class Writer:
    """A GroupCommit over the stand-in disk; `add` puts records in the open batch and lets the loop
    run a few iterations, and answers the records of each write so far."""

    def __init__(self, clock: Clock, sync: bool, fsync_seconds: float = 0.001):
        self.opened: list = []
        self.disk = Disk(clock, self.opened, fsync_seconds)
        self.gc = group_commit.GroupCommit(self.disk, sync, written=lambda b: group_commit.answer(b.future),
                                           on_fatal=lambda e: None)

    async def add(self, records: int = 0, replicated: bool = False) -> list[int]:
        if records:
            b = self.gc.batch()
            if not self.opened or self.opened[-1] is not b:
                self.opened.append(b)
            b.records += records
            if replicated:
                self.gc.without_wait()
        await _iterations()
        return self.disk.writes


def test_a_smaller_batch_waits_for_the_rest_then_goes_together(clock):
    async def main():
        w = Writer(clock, sync=True)
        assert await w.add(3) == [3]  # the first batch: nothing to compare with, written at once
        assert await w.add(1) == [3]  # 1 < 3: waiting, within half the last fsync's 1 ms
        clock.now += 0.0002
        assert await w.add(2) == [3, 3]  # the others arrive 0.2 ms later: together, the batch as large as the last
    asyncio.run(main())


def test_the_wait_ends_at_half_the_last_fsync_and_a_lone_producer_never_waits(clock):
    async def main():
        w = Writer(clock, sync=True)
        await w.add(4)
        assert await w.add(1) == [4]
        clock.now += 0.0005  # half the last write's 1 ms: nobody else came
        assert await w.add() == [4, 1]
        assert await w.add(1) == [4, 1, 1]  # now the last batch was 1: a lone producer's goes at once
    asyncio.run(main())


def test_however_slow_the_fsync_a_batch_waits_no_more_than_the_cap(clock):
    async def main():
        w = Writer(clock, sync=True, fsync_seconds=0.010)  # a 10 ms fsync: half of it would be 5 ms
        await w.add(5)
        assert await w.add(1) == [5]
        clock.now += group_commit.MAX_COMMIT_DELAY
        assert await w.add() == [5, 1]
    asyncio.run(main())


def test_a_slaves_batch_never_waits(clock):
    """A slave's records are its master's batch: nothing joins them before the master's next write."""
    async def main():
        w = Writer(clock, sync=True)
        await w.add(6, replicated=True)
        assert await w.add(2, replicated=True) == [6, 2]
    asyncio.run(main())


def test_async_flush_never_waits(clock):
    async def main():
        w = Writer(clock, sync=False)
        await w.add(8)
        assert await w.add(1) == [8, 1]
    asyncio.run(main())
