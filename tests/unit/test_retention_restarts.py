"""Retention, then a restart, on a real store (found by the review of 6396a24, seed 556's fix):

- a committed job still resolving, one of whose ended members retention deleted within its
  decision's linger: the store could not be opened again (KeyError reading the member's half);
- TRANS_CHECK_MAX_TIME's newest entry went when its transaction ended and its park record was
  deleted, though its half was kept for it: after a restart the queue's end went back and the next
  parked transaction reused an offset a reader had already passed;
- the delay queues have no topic record, so after a restart the first retention mark did not keep
  their newest records: a pass could empty a delivered delay queue, and after another restart its
  end was 0 while its delivery cursor stood further on (new retries below the cursor, never due)."""

from __future__ import annotations

import asyncio

from txbroker.broker.schedule_service import SCHEDULE_GROUP
from txbroker.protocol.bodies import Message
from txbroker.protocol.codes import TransactionState
from txbroker.protocol.names import (
    PROPERTY_DELIVER_MS, PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC as TCMT,
)
from txbroker.store import retention
from txbroker.store.boot_clock import BootClock
from txbroker.store.records import (
    EndRecord, HalfRecord, JobDecisionRecord, JobOpenRecord, JobPrepareRecord, OffsetRecord, ParkRecord, TopicRecord,
)
from txbroker.store.state import StateMachine

LATER = 10 ** 7  # ms: past every decision's floor


def open_store(path) -> StateMachine:
    state = StateMachine(str(path), False, lambda e: None)
    if "T" not in state.topics:
        state.append(TopicRecord("T", 4))
    return state


def half(state: StateMachine, txid: str, msgs: list[Message], **kw) -> int:
    return state.append(HalfRecord(txid, "g", 1, msgs, **kw))[0]


def end(state: StateMachine, txid: str, half_lsn: int, queues, end_ms: int = 1) -> None:
    state.append_to_queues(queues, lambda offsets: EndRecord(txid, half_lsn, TransactionState.COMMIT, end_ms, offsets))


async def retain(state: StateMachine, now_ms: int) -> None:
    mark = state.marks.take(now_ms, state.next_lsn, 0, state.lineage(), BootClock())
    await retention.delete_before(state, mark, now_ms)
    retention.expire(state, now_ms)


def test_a_store_opens_again_after_retention_took_an_ended_member_of_a_job_still_resolving(tmp_path):
    async def main():
        state = open_store(tmp_path / "s")
        state.append(JobOpenRecord("j1", "g", 1, 10 ** 12))
        h1 = half(state, "m1", [Message("T", b"m1", queue_id=0)], job_id="j1")
        half(state, "m2", [Message("T", b"m2", queue_id=1)], job_id="j1")
        state.append(JobPrepareRecord("j1", ["m1", "m2"], 1))
        state.append(JobDecisionRecord("j1", TransactionState.COMMIT, 1, ["m1", "m2"]))
        end(state, "m1", h1, [("T", 0, 1)], end_ms=LATER)  # m1 ended; m2 still to end
        state.append_messages(1, [Message("T", b"after", queue_id=0)])  # m1's half is not T:0's newest
        await state.drain()
        await retain(state, LATER + 1000)  # within m1's decision's linger: its half goes, its decision stays
        await state.close()
        state = open_store(tmp_path / "s")  # KeyError before
        try:
            assert state.pending_transaction("m2") is not None
        finally:
            await state.close()
    asyncio.run(main())


def test_the_parked_queue_keeps_its_end_across_retention_and_a_restart(tmp_path):
    async def main():
        state = open_store(tmp_path / "s")
        h1 = half(state, "t1", [Message("T", b"a", queue_id=0)])
        state.append_to_queues([(TCMT, 0, 1)], lambda offsets: ParkRecord("t1", 5, offsets))
        end(state, "t1", h1, [("T", 0, 1)])  # resumed and committed by hand
        state.append_messages(1, [Message("T", b"b", queue_id=0)])
        await state.drain()
        assert state.queue_end(TCMT, 0) == 1
        await retain(state, LATER)
        await state.close()
        state = open_store(tmp_path / "s")
        try:
            assert state.queue_end(TCMT, 0) == 1  # 0 before: the next park would reuse offset 0
        finally:
            await state.close()
    asyncio.run(main())


def test_a_delay_queue_keeps_its_end_across_restarts_and_retention(tmp_path):
    async def main():
        state = open_store(tmp_path / "s")
        for i in range(5):
            state.append_messages(1, [Message(SCHEDULE_TOPIC, b"r%d" % i, queue_id=0,
                                              properties={PROPERTY_REAL_TOPIC: "T", PROPERTY_DELIVER_MS: "2"})])
        state.append(OffsetRecord(SCHEDULE_GROUP, [(SCHEDULE_TOPIC, 0, 5)]))  # all delivered
        state.append_messages(1, [Message("T", b"x", queue_id=0)])
        await state.drain()
        await state.close()
        state = open_store(tmp_path / "s")
        await retain(state, LATER)  # the first pass after a restart (a slave runs no schedule service)
        await state.close()
        state = open_store(tmp_path / "s")
        try:
            assert state.queue_end(SCHEDULE_TOPIC, 0) == 5  # 0 before, with the cursor at 5
        finally:
            await state.close()
    asyncio.run(main())


def test_a_park_recorded_before_decisions_listed_parked_entries_still_takes_its_entry_along(tmp_path):
    """A transaction parked by a broker before 9079a36 (its pending entry lists no parked offsets),
    resumed and parked again after: its first park's entry goes with that park record, as it did;
    its second goes with its half (found by the review of 9079a36)."""
    from txbroker.protocol.bodies import encode
    from txbroker.store.records import ResumeRecord, decode_pending

    async def main():
        state = open_store(tmp_path / "s")
        h1 = half(state, "t1", [Message("T", b"a", queue_id=0)])
        state.append_to_queues([(TCMT, 0, 1)], lambda offsets: ParkRecord("t1", 5, offsets))
        await state.drain()
        p = decode_pending(state.db.pending.get(b"t1"))
        p.parked_offsets = []  # as the broker before 9079a36 wrote it
        state.db.pending.put(b"t1", encode(p))
        await state.close()
        state = open_store(tmp_path / "s")
        state.append(ResumeRecord("t1", 6))
        state.append_to_queues([(TCMT, 0, 1)], lambda offsets: ParkRecord("t1", 7, offsets))
        end(state, "t1", h1, [("T", 0, 1)])
        for i in range(2):  # newer parked entries: t1's are no longer the queue's newest
            half(state, f"x{i}", [Message("T", b"x", queue_id=1)])
            state.append_to_queues([(TCMT, 0, 1)], lambda offsets, i=i: ParkRecord(f"x{i}", 8, offsets))
        state.append_messages(1, [Message("T", b"b", queue_id=0)])
        await state.drain()
        await retain(state, LATER)
        await retain(state, 2 * LATER)
        try:
            assert state.queue_start(TCMT, 0) == 2  # t1's entries 0 and 1 gone, the others kept
        finally:
            await state.close()
    asyncio.run(main())
