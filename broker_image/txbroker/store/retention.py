"""Retention: deleting old log records by age and by size, as RocketMQ's fileReservedTime and Kafka's
retention.ms / retention.bytes do, without deleting what is still needed.

The broker takes a *mark* at every retention pass (store/derived/marks.py): the time, the next LSN,
the log bytes so far, and every family's lineage then (the records live state is derived from).
Deleting the records before a mark's LSN C keeps
- those lineages: a pending or parked transaction's half message and its check, park and resume
  records, an undecided job's open and prepare records, the newest record of each consumer offset,
  topic and producer group's settings (store/derived/ says why each);
- what a slave or a reader still needs: C never passes what every connected slave has, nor what is
  published (the caller's limit).
A deleted record takes with it what it derived, as its family says (`forget`): its queue-index and
key-index entries (the queues now start later: a consumer below the start gets PULL_OFFSET_MOVED),
its send-back key, a decision's entry unless someone may still ask about it (or its half, kept,
still needs it to find the half's queue entries). State that outlives
its records goes by its own rule at every pass (`expire`: decisions and jobs).

Deletion runs in chunks, each one WriteBatch holding records and everything derived from them, so
a kill between chunks leaves a consistent store; the loop yields between chunks.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from rocksdict import WriteBatch

from txbroker.store import keys
from txbroker.store.derived.family import RetentionPass
from txbroker.store.derived.marks import Mark, choose_cutoff  # noqa: F401 - the pass's policy, re-exported
from txbroker.store.records import decode_record

if TYPE_CHECKING:
    from txbroker.store.state import StateMachine

CHUNK = 2_000


async def delete_before(state: "StateMachine", mark: Mark, now_ms: int) -> int:
    """Delete the log records before `mark.lsn` that no lineage needs; returns how many went."""
    db = state.db
    h_log = db.handles["log"]
    # Records before the mark are written: their keys are, once this returns, so forgetting a record
    # deletes every entry it has (none is written after it is gone).
    await state.key_index.caught_up()
    needed = frozenset(mark.needed)
    rp = RetentionPass(now_ms, mark.lsn, needed)
    deleted = 0
    # Records an earlier pass kept (needed then) go now if they are no longer needed.
    kept_before = state.marks.kept()
    wb = WriteBatch(raw_mode=True)
    for lsn in kept_before:
        if lsn in needed or lsn >= mark.lsn:
            continue
        raw = db.log.get(keys.lsn_key(lsn))
        if raw is not None:
            wb.delete(keys.lsn_key(lsn), h_log)
            state.forget(lsn, decode_record(raw), wb, rp)
            deleted += 1
    still_kept = {lsn for lsn in kept_before if lsn in needed or lsn >= mark.lsn}
    pos = state.log_complete_from
    while True:
        stop = min(pos + CHUNK, mark.lsn)
        for k, raw in db.log.items(from_key=keys.lsn_key(pos)):
            lsn = keys.lsn_from_key(k)
            if lsn >= stop:
                break
            if lsn in needed:
                still_kept.add(lsn)
                continue
            wb.delete(k, h_log)
            state.forget(lsn, decode_record(raw), wb, rp)
            deleted += 1
        last = stop >= mark.lsn
        state.marks.record_pass(wb, sorted(still_kept), stop, mark if last else None)
        db.db.write(wb)
        state.forget_before(stop)
        if last:
            return deleted
        pos = stop
        wb = WriteBatch(raw_mode=True)
        await asyncio.sleep(0)  # let requests in between chunks


def expire(state: "StateMachine", now_ms: int) -> int:
    """State that outlives its records (decisions someone may still ask about, decided jobs), gone
    by its own rule; every pass, whether it deleted records or not. Returns how many entries went."""
    wb = WriteBatch(raw_mode=True)
    gone = state.expire(wb, RetentionPass(now_ms, state.log_complete_from))
    if gone or wb.len():
        state.db.db.write(wb)
    return gone
