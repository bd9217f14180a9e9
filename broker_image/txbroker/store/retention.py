"""Retention: deleting old log records by age and by size, as RocketMQ's fileReservedTime and Kafka's
retention.ms / retention.bytes do, without deleting what is still needed.

The broker takes a *mark* at every retention pass (meta `mark/<u64 BE ms>`: the time, the next LSN,
the log bytes written so far and the half-message LSNs of the transactions pending then). Deleting
the records before a mark's LSN C keeps
- the half records of the transactions pending at C: whether they are still pending (or parked)
  or were decided after C, their messages are read from those records;
- what a slave or a reader still needs: C never passes what every connected slave has, nor what is
  published.
A deleted record takes with it what it derived: its queue-index entries (the queues now start
later: a consumer below the start gets PULL_OFFSET_MOVED), its key-index entries and send-back key,
and, for a decided transaction, its entry in the decision index (so a duplicate END within the
retention window is answered `already`; after it, QUERY_NOT_FOUND).

Deletion runs in chunks, each one WriteBatch holding records and everything derived from them, so
a kill between chunks leaves a consistent store; the loop yields between chunks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import msgspec
from rocksdict import WriteBatch

from txbroker.store import keys
from txbroker.store.records import EndRecord, HalfRecord, NormalRecord, ParkRecord, decode_finished, decode_record

if TYPE_CHECKING:
    from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)

MARK_PREFIX = b"mark/"
COMPLETE_KEY = b"complete_from"  # u64 BE LSN: the log holds every record from here on
KEPT_KEY = b"kept"  # msgpack list of LSNs: the records before complete_from still kept (needed)
CHUNK = 2_000


class Mark(msgspec.Struct, array_like=True):
    ms: int
    lsn: int  # the next LSN when the mark was taken
    log_bytes: int  # bytes of log records written before it, ever
    pending: list[int]  # half-record LSNs of the transactions pending then


_encode = msgspec.msgpack.Encoder().encode
decode_mark = msgspec.msgpack.Decoder(Mark).decode


def take_mark(state: "StateMachine", now_ms: int) -> None:
    m = Mark(now_ms, state.next_lsn, state.log_bytes, sorted(p.half_lsn for p in state.pending_transactions()))
    state.db.meta.put(MARK_PREFIX + keys.lsn_key(now_ms), _encode(m))


def marks(state: "StateMachine") -> list[Mark]:
    out = []
    for k, v in state.db.meta.items(from_key=MARK_PREFIX):
        if not k.startswith(MARK_PREFIX):
            break
        out.append(decode_mark(v))
    return out


def choose_cutoff(all_marks: list[Mark], now_ms: int, retention_ms: int, retention_bytes: int, log_bytes: int,
                  limit_lsn: int) -> Mark | None:
    """The latest mark before which records may go: by age, the last one older than `retention_ms`;
    by size (`retention_bytes` > 0), the last one after which the log still holds that many bytes (so
    it holds at most `retention_bytes` plus one interval's writes, as Kafka's holds at most
    retention.bytes plus a segment). Never one past `limit_lsn`."""
    usable = [m for m in all_marks if m.lsn <= limit_lsn]
    by_age = [m for m in usable if m.ms <= now_ms - retention_ms]
    chosen = by_age[-1] if by_age else None
    if retention_bytes > 0:
        by_size = [m for m in usable if log_bytes - m.log_bytes >= retention_bytes]
        if by_size and (chosen is None or by_size[-1].lsn > chosen.lsn):
            chosen = by_size[-1]
    return chosen


async def delete_before(state: "StateMachine", mark: Mark) -> int:
    """Delete the log records before `mark.lsn` that are not needed; returns how many went."""
    db, h = state.db, state.db.handles
    needed = set(mark.pending)
    deleted = 0
    touched: set[bytes] = set()
    # Records an earlier pass kept (pending then) go now if they are no longer needed.
    kept_before = _kept(state)
    wb = WriteBatch(raw_mode=True)
    for lsn in kept_before:
        raw = db.log.get(keys.lsn_key(lsn))
        if lsn not in needed and raw is not None:
            wb.delete(keys.lsn_key(lsn), h["log"])
            _forget_derived(state, wb, lsn, decode_record(raw), touched)
            deleted += 1
    pos = state.log_complete_from
    while True:
        stop = min(pos + CHUNK, mark.lsn)
        for k, raw in db.log.items(from_key=keys.lsn_key(pos)):
            lsn = keys.lsn_from_key(k)
            if lsn >= stop:
                break
            if lsn in needed:
                continue
            wb.delete(k, h["log"])
            _forget_derived(state, wb, lsn, decode_record(raw), touched)
            deleted += 1
        last = stop >= mark.lsn
        if last:
            for m in marks(state):
                if m.lsn < mark.lsn:
                    wb.delete(MARK_PREFIX + keys.lsn_key(m.ms), h["meta"])
        wb.put(KEPT_KEY, _encode(sorted(needed if last else needed | set(kept_before))), h["meta"])
        wb.put(COMPLETE_KEY, keys.lsn_key(stop), h["meta"])
        db.db.write(wb)
        state.forget_before(stop, touched)
        if last:
            return deleted
        pos = stop
        wb = WriteBatch(raw_mode=True)
        await asyncio.sleep(0)  # let requests in between chunks


def _kept(state: "StateMachine") -> list[int]:
    raw = state.db.meta.get(KEPT_KEY)
    return msgspec.msgpack.decode(raw, type=list[int]) if raw is not None else []


def _forget_derived(state: "StateMachine", wb: WriteBatch, lsn: int, r, touched: set[bytes]) -> None:
    h = state.db.handles
    kind = type(r)
    if kind is NormalRecord:
        touched |= state.forget_messages(wb, lsn, r.messages, r.queue_offsets)
        if r.send_back:
            wb.delete(r.send_back, h["meta"])
    elif kind is HalfRecord:
        # decided before the mark (else it would be needed): its commit's index entries point here
        stored = state.db.tx.get(r.transaction_id.encode())
        done = decode_finished(stored) if stored is not None else None
        if done is not None and done.half_lsn == lsn and done.queue_offsets:
            touched |= state.forget_messages(wb, lsn, r.messages, done.queue_offsets)
    elif kind is EndRecord:
        stored = state.db.tx.get(r.transaction_id.encode())
        if stored is not None and decode_finished(stored).end_lsn == lsn:
            wb.delete(r.transaction_id.encode(), h["tx"])
    elif kind is ParkRecord and state.pending_transaction(r.transaction_id) is None:
        for prefix, offset in state._queue_entries(r):
            wb.delete(keys.cq_key(prefix, offset), h["cq"])
            touched.add(prefix)
