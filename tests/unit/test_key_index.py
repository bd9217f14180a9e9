"""The key index kept behind the log (store/derived/key_index.py), on a real store: a record's keys
are written after it, so whatever a crash, a failed write, a retention pass or a truncation meets,
the keys column family ends as the index derived from the log that is left, and a read by key sees
every committed message the moment its commit is written."""

import asyncio
import gc
import random

import pytest
from rocksdict import WriteBatch

from txbroker.protocol.bodies import Message
from txbroker.protocol.codes import TransactionState
from txbroker.store import keys, retention
from txbroker.store.boot_clock import BootClock
from txbroker.store.derived import key_index
from txbroker.store.reads import MessageReader
from txbroker.store.records import (
    COMMITTED, EndRecord, EpochRecord, HalfRecord, NormalRecord, decode_record, keys_of, runs_of,
)
from txbroker.store.state import StateMachine

from test_truncation import step

BOOT = BootClock()


def keyed(state: StateMachine, tag: str, n: int = 3) -> tuple[int, int]:
    """A plain send of n keyed messages and a committed transaction of n; returns their LSNs."""
    normal, _offsets, _f = state.append_messages(1, [Message("T", b"%s-n%d" % (tag.encode(), i), keys=f"{tag}-n",
                                                             queue_id=i % 2) for i in range(n)])
    half, _f = state.append(HalfRecord(f"tx-{tag}", "g", 1, [
        Message("T", b"%s-t%d" % (tag.encode(), i), keys=f"{tag}-t k{i}", queue_id=i % 2) for i in range(n)]))
    p = state.pending_transaction(f"tx-{tag}")
    state.append_to_queues(p.runs, lambda offsets: EndRecord(p.transaction_id, half, TransactionState.COMMIT, 2,
                                                             offsets))
    return normal, half


def crash(state: StateMachine) -> None:
    """What kill -9 leaves: the log as written, and the backlog not written. (Every reference to the
    store goes, as the process would: a column family's handle keeps RocksDB's LOCK.)"""
    state.key_index.close()
    state.db.close()
    for family in state.families:
        family.__dict__.clear()
    state.__dict__.clear()
    gc.collect()


def entries(state: StateMachine) -> dict:
    return dict(state.db.keys.items())


def expected(state: StateMachine) -> dict:
    """The key index of the records the log holds now, derived from them alone: a plain send's
    keyed messages, and a committed half's (at the offsets its decision gave them)."""
    out = {}
    for k, raw in state.db.log.items():
        lsn, r = keys.lsn_from_key(k), decode_record(raw)
        if type(r) is NormalRecord:
            offsets = r.queue_offsets
        elif type(r) is HalfRecord:
            done = state.finished(r.transaction_id)
            if done is None or done.state != COMMITTED or done.half_lsn != lsn or not done.queue_offsets:
                continue
            offsets = done.queue_offsets
        else:
            continue
        texts = keys_of(r.messages)
        if texts:
            for key, i in keys.key_entries(lsn, runs_of(r.messages), texts):
                out[key] = keys.lsn_key(offsets[i])
    return out


def test_a_commit_is_found_by_key_as_soon_as_it_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(key_index, "IDLE_S", 3600.0)  # never idle: only the read writes the backlog

    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        keyed(s, "a")
        await s.barrier()
        assert entries(s) == {}, "the commit's keys were written with it: nothing here is behind the log"
        reader = MessageReader(s)
        assert [m.body for m in reader.by_key("T", "a-t", 10)] == [b"a-t0", b"a-t1", b"a-t2"]
        assert [m.body for m in reader.by_key("T", "k1", 10)] == [b"a-t1"]
        assert [m.body for m in reader.by_key("T", "a-n", 10)] == [b"a-n0", b"a-n1", b"a-n2"]
        await s.close()

    asyncio.run(main())


def test_keys_behind_at_a_crash_are_indexed_again_from_the_log(tmp_path, monkeypatch):
    monkeypatch.setattr(key_index, "IDLE_S", 3600.0)

    async def main():
        s = StateMachine(str(tmp_path / "s"), False, lambda e: None)
        keyed(s, "a")
        await s.drain()  # indexed and marked
        keyed(s, "b")
        await s.barrier()
        assert s.key_index.backlog_messages() == 6
        crash(s)
        s = StateMachine(str(tmp_path / "s"), False, lambda e: None)
        reader = MessageReader(s)
        assert [m.body for m in reader.by_key("T", "b-t", 10)] == [b"b-t0", b"b-t1", b"b-t2"]
        assert [m.body for m in reader.by_key("T", "a-n", 10)] == [b"a-n0", b"a-n1", b"a-n2"]
        await s.drain()
        assert entries(s) == expected(s) and len(entries(s)) == 18
        await s.close()

    asyncio.run(main())


def test_a_clean_stop_leaves_nothing_behind(tmp_path, monkeypatch):
    """A broker stopped cleanly leaves every key written (an older broker, which knows no backlog,
    can open the store after a rollback and find every message by key)."""
    monkeypatch.setattr(key_index, "IDLE_S", 3600.0)

    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        keyed(s, "a")
        await s.barrier()
        await s.close()
        s = StateMachine(str(tmp_path), False, lambda e: None)
        assert s.key_index.backlog_messages() == 0
        assert len(entries(s)) == 9
        await s.close()

    asyncio.run(main())


def test_the_backlog_is_written_once_the_loop_is_idle(tmp_path):
    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        keyed(s, "a")
        await s.barrier()
        for _ in range(1000):  # the loop has nothing else to do
            if not s.key_index.backlog_messages():
                break
            await asyncio.sleep(0.01)
        assert len(entries(s)) == 9
        await s.close()

    asyncio.run(main())


def test_a_large_backlog_is_written_while_the_loop_is_busy(tmp_path, monkeypatch):
    monkeypatch.setattr(key_index, "IDLE_S", 3600.0)
    monkeypatch.setattr(key_index, "MAX_BACKLOG", 20)

    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        for i in range(5):
            keyed(s, f"x{i}")
            await s.barrier()
            await asyncio.sleep(0)
        for _ in range(1000):
            if s.key_index.backlog_messages() < 20:
                break
            await asyncio.sleep(0)
        assert s.key_index.backlog_messages() < 20
        await s.close()

    asyncio.run(main())


@pytest.mark.parametrize("seed", range(16))
def test_crashes_retention_and_truncation_leave_the_index_of_the_kept_log(tmp_path, monkeypatch, seed):
    """Random histories of every record kind, with crashes (the backlog lost), retention passes and
    truncations while records' keys are still to be written: at the end, the keys column family is
    the index derived from the log that is left (`expected`), and a read of each key finds as many
    messages as it holds entries (the records' own keys, k<i>)."""
    rnd = random.Random(seed)
    if seed % 2:
        monkeypatch.setattr(key_index, "IDLE_S", 3600.0)  # behind all along, but for the reads and passes

    async def main():
        path = str(tmp_path / "s")
        s = StateMachine(path, False, lambda e: None)
        s.append(EpochRecord(1, "a", 0))
        for i in range(220):
            step(rnd, s, i)
            if i % 7 == 6:
                await s.barrier()
                what = rnd.random()
                if what < 0.25:
                    crash(s)
                    s = StateMachine(path, False, lambda e: None)
                elif what < 0.5:
                    s.marks.take(i, s.next_lsn, s.log_bytes, s.lineage(), BOOT)
                    usable = [m for m in s.marks.all() if m.lsn > s.log_complete_from]
                    if usable:
                        await retention.delete_before(s, rnd.choice(usable), i)
                elif what < 0.6 and s.next_lsn > 3:
                    await s.truncate_after(rnd.randrange(max(s.log_complete_from, 2), s.next_lsn))
        await s.barrier()
        if rnd.random() < 0.5:
            crash(s)
            s = StateMachine(path, False, lambda e: None)
        probe = {(t, f"k{i}") for t in ("T", "U") for i in range(220)}
        found = {(t, k): [m.body for m in MessageReader(s).by_key(t, k, 100)] for t, k in probe}
        await s.drain()
        want = expected(s)
        assert entries(s) == want
        assert s.key_index.through == s.next_lsn - 1
        assert sum(map(len, found.values())) == sum(1 for k in want if k.split(b"\x00")[1].startswith(b"k"))
        await s.close()

    asyncio.run(main())


class FailingWrites:
    """The store's RocksDB, whose next `fail` writes raise (a full disk, say)."""

    def __init__(self, db, fail: int):
        self._db, self.fail = db, fail

    def write(self, *args, **kwargs):
        if self.fail:
            self.fail -= 1
            raise OSError("IO error: No space left on device")
        return self._db.write(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_a_failed_write_of_the_key_index_loses_no_key(tmp_path, monkeypatch):
    """The records of a write that failed (on a read by key, or the timer's) are still queued: a
    later write, or the next start, indexes them (the review's reproduction: they were taken off
    the queue first, and `through` moved past them with the next write)."""
    monkeypatch.setattr(key_index, "IDLE_S", 3600.0)

    async def main():
        fatal = []
        s = StateMachine(str(tmp_path), False, fatal.append)
        keyed(s, "a")
        await s.barrier()
        real = s.db.db
        s.db.db = FailingWrites(real, 1)
        with pytest.raises(OSError):
            MessageReader(s).by_key("T", "a-t", 10)
        assert s.key_index.backlog_messages() == 6
        s.db.db.fail = 1
        monkeypatch.setattr(key_index, "IDLE_S", 0.0)
        s.key_index.close()
        s.key_index._tick()  # the timer's write fails too: the store is told to stop
        assert fatal and s.key_index.backlog_messages() == 6
        s.db.db = real
        keyed(s, "b")  # a request answered while the broker stops
        await s.barrier()
        for _ in range(100):  # the timer, once the loop is idle
            if not s.key_index.backlog_messages():
                break
            await asyncio.sleep(0.01)
        assert s.key_index.backlog_messages() == 0
        assert [m.body for m in MessageReader(s).by_key("T", "a-t", 10)] == [b"a-t0", b"a-t1", b"a-t2"]
        await s.close()

    asyncio.run(main())


def test_a_mark_above_the_log_end_is_brought_down_at_the_start(tmp_path, monkeypatch):
    """A release before the key index was written behind the log truncates without knowing the mark
    (a rollback, then forward again): records written again below the old mark must still be
    indexed again after a crash."""
    monkeypatch.setattr(key_index, "IDLE_S", 3600.0)

    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        for i in range(5):
            keyed(s, f"x{i}")
        await s.drain()
        crash(s)
        s = StateMachine(str(tmp_path), False, lambda e: None)
        # what the older broker's truncation leaves: the log cut, the mark not
        wb = WriteBatch(raw_mode=True)
        wb.delete_range(keys.lsn_key(6), keys.lsn_key(2**64 - 1), s.db.handles["log"])
        s.db.db.write(wb)
        crash(s)
        s = StateMachine(str(tmp_path), False, lambda e: None)
        assert s.key_index.through == s.next_lsn - 1 == 5
        keyed(s, "y")
        await s.barrier()
        crash(s)
        s = StateMachine(str(tmp_path), False, lambda e: None)
        assert [m.body for m in MessageReader(s).by_key("T", "y-n", 10)] == [b"y-n0", b"y-n1", b"y-n2"]
        await s.close()

    asyncio.run(main())


def test_the_mark_moves_under_steady_load_without_keys(tmp_path, monkeypatch):
    """Recovery scans the log after the mark: while no key waits, the mark follows the log every
    MARK_LAG records, idle or not (the review: it stood still until the loop was idle)."""
    monkeypatch.setattr(key_index, "IDLE_S", 3600.0)
    monkeypatch.setattr(key_index, "MARK_LAG", 50)

    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        for i in range(400):
            s.append_messages(1, [Message("T", b"m%d" % i, queue_id=0)])
            await s.barrier()
            await asyncio.sleep(0)
        assert s.next_lsn - 1 - s.key_index.through <= 2 * 50
        await s.close()

    asyncio.run(main())


def test_a_large_backlog_is_written_in_slices_for_a_read_by_key(tmp_path, monkeypatch):
    """A read by key waiting on many keys lets other work run between slices (the review measured
    the loop stopped 0.38 s for 200,000 keys written at once)."""
    monkeypatch.setattr(key_index, "IDLE_S", 3600.0)
    monkeypatch.setattr(key_index, "SLICE", 4)

    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        for i in range(10):
            keyed(s, f"x{i}")
        await s.barrier()
        ticks = 0

        async def other_work():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        before = ticks
        await s.index_keys_now()
        t.cancel()
        assert s.key_index.backlog_messages() == 0
        assert ticks - before >= 5, "the keys were written in one step"
        await s.close()

    asyncio.run(main())
