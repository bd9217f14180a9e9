"""Retention and a queue's index, on a real store (the fault harness, seed 556: a restored backup
whose queues no reader could get past).

A committed transaction's queue entries point into its half record, and only its decision
(FinishedTx) says where they are. When the half outlived its END (kept as its queue's newest
record) and the decision expired meanwhile, deleting the half left its entries behind, pointing
at nothing. And a reader at an offset whose next stretch retention emptied got nothing and no
further offset, for good, though the queue went on after the gap."""

from __future__ import annotations

import asyncio

from txbroker.protocol.bodies import Message
from txbroker.protocol.codes import TransactionState
from txbroker.store import retention
from txbroker.store.boot_clock import BootClock
from txbroker.store.derived.transactions import DECISION_FLOOR_MS
from txbroker.store.reads import MessageReader
from txbroker.store.records import EndRecord, HalfRecord, runs_of
from txbroker.store.state import StateMachine

LATER = 10 ** 7  # ms: past every decision's floor


def commit(state: StateMachine, txid: str, msgs: list[Message], end_ms: int = 1) -> int:
    """Prepare and commit as TransactionService does; returns the half's LSN."""
    lsn, _ = state.append(HalfRecord(txid, "g", 1, msgs))
    state.append_to_queues(runs_of(msgs),
                           lambda offsets: EndRecord(txid, lsn, TransactionState.COMMIT, end_ms, offsets))
    return lsn


async def retain(state: StateMachine, now_ms: int) -> None:
    """A mark now, and a retention pass up to it (as if its age had passed)."""
    mark = state.marks.take(now_ms, state.next_lsn, 0, state.lineage(), BootClock())
    await retention.delete_before(state, mark, now_ms)
    retention.expire(state, now_ms)


def read_from_start(state: StateMachine, topic: str, queue: int) -> list[bytes]:
    """What a consumer starting at the queue's start reads, 64 at a time, to the end."""
    reader, out = MessageReader(state), []
    offset, end = state.queue_start(topic, queue), state.readable_end(topic, queue)
    while offset < end:
        msgs, nxt, end = reader.read_queue(topic, queue, offset, 64)
        assert nxt > offset, f"stuck at offset {offset} of {topic}:{queue} (end {end})"
        out += [m.body for m in msgs]
        offset = nxt
    return out


def test_a_half_that_outlived_its_decision_takes_its_queue_entries_along(tmp_path):
    async def main():
        state = StateMachine(str(tmp_path / "store"), False, lambda e: None)
        try:
            commit(state, "t1", [Message("T", b"t1", queue_id=0)])
            await state.drain()
            # t1's half is T:0's newest record: kept. Its END goes, and its decision with it (long past).
            await retain(state, LATER)
            commit(state, "t2", [Message("T", b"t2", queue_id=0)], end_ms=LATER)
            await state.drain()
            await retain(state, LATER + DECISION_FLOOR_MS + 1)  # t1's half is no one's newest now: it goes
            assert read_from_start(state, "T", 0) == [b"t2"]
            assert state.queue_start("T", 0) == 1  # nothing left pointing at the deleted half
        finally:
            await state.close()
    asyncio.run(main())


def test_a_reader_passes_over_what_retention_emptied_below_a_kept_record(tmp_path):
    async def main():
        state = StateMachine(str(tmp_path / "store"), False, lambda e: None)
        try:
            # offset 0 of T:0 in a transaction whose other message is the newest of T:1: kept
            commit(state, "t1", [Message("T", b"kept", queue_id=0), Message("T", b"other", queue_id=1)])
            for i in range(100):  # offsets 1-100: deleted but the newest, old-99 (its queue's end)
                state.append_messages(1, [Message("T", b"old-%d" % i, queue_id=0)])
            await state.drain()
            await retain(state, LATER)
            for i in range(3):  # offsets 101-103, after the cut
                state.append_messages(1, [Message("T", b"new-%d" % i, queue_id=0)])
            await state.drain()
            assert read_from_start(state, "T", 0) == [b"kept", b"old-99", b"new-0", b"new-1", b"new-2"]
        finally:
            await state.close()
    asyncio.run(main())


def test_entries_a_store_leaked_before_the_fix_are_passed_over_by_every_read(tmp_path, monkeypatch):
    """A store written before 6396a24 may hold such entries (their records deleted, the entries
    left): reads by queue go past them, a long run of them in bounded steps, and reads by key skip
    them instead of failing (AttributeError: a QUERY_MESSAGE answered SYSTEM_ERROR)."""
    from txbroker.store import keys, reads
    monkeypatch.setattr(reads, "MAX_DEAD_RUNS", 4)

    async def main():
        state = StateMachine(str(tmp_path / "store"), False, lambda e: None)
        try:
            lsns = [state.append_messages(1, [Message("T", b"m%d" % i, "", "k", queue_id=0)])[0] for i in range(12)]
            await state.drain()
            for lsn in lsns[:10]:  # what the old code left: the records gone, their entries not
                state.db.log.delete(keys.lsn_key(lsn))
            reader = MessageReader(state)
            msgs, nxt, end = reader.read_queue("T", 0, 0, 64)
            assert (msgs, nxt, end) == ([], 4, 12)  # four dead runs examined, then on from there next time
            assert read_from_start(state, "T", 0) == [b"m10", b"m11"]
            assert [m.body for m in reader.by_key("T", "k", 10)] == [b"m10", b"m11"]
        finally:
            await state.close()
    asyncio.run(main())
