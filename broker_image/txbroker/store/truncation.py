"""Truncating the log: a rejoining broker drops the records its new master never had.

Everything happens in one WriteBatch: the log records after the kept LSN go, and with them what
they derived (queue-index and key-index entries, send-back keys, epochs), and the state they
changed is derived again from the kept log, only where they changed it:
- transactions they touched: from each one's half record on, replaying only that transaction's
  records (a long-pending transaction makes this walk longer, nothing else does);
- consumer offsets, topics and producer groups' settings they set: the latest kept record that set
  each, walking back;
- jobs (coordinated transactions) they opened, prepared or decided: from each one's open record on.
A kill at any point leaves the store as it was before the truncation or after it, never between,
so recovery has nothing to finish (no marker, no resumable state); the caller reloads memory.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rocksdict import WriteBatch

from txbroker.store import keys
from txbroker.store.db import sync_write_options
from txbroker.store.group_commit import Batch
from txbroker.store.records import (
    CheckRecord, EndRecord, EpochRecord, GroupSettingsRecord, HalfRecord, JobDecisionRecord, JobOpenRecord, JobPrepareRecord, NormalRecord,
    OffsetRecord, ParkRecord, ResumeRecord, TopicRecord, decode_finished, decode_job, decode_pending, decode_record,
)

if TYPE_CHECKING:
    from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)

_TX_RECORDS = (HalfRecord, EndRecord, ParkRecord, ResumeRecord)
_JOB_RECORDS = (JobOpenRecord, JobPrepareRecord, JobDecisionRecord)


def truncate(state: "StateMachine", last_kept: int) -> int:
    """Drop records after `last_kept` and their effects, atomically; returns how many were dropped."""
    db, h = state.db, state.db.handles
    dropped = [(keys.lsn_from_key(k), decode_record(raw)) for k, raw in db.log.items(from_key=keys.lsn_key(last_kept + 1))]
    if not dropped:
        return 0
    log.warning("truncating the log after LSN %d: %d records the master does not have", last_kept, len(dropped))
    scratch = Batch(None)  # the state machine's own apply code writes into this batch
    wb: WriteBatch = scratch.wb
    wb.delete_range(keys.lsn_key(last_kept + 1), keys.lsn_key(2**64 - 1), h["log"])
    txids: set[str] = set()
    offsets: set[tuple[str, str, int]] = set()
    topics: set[str] = set()
    groups: set[str] = set()
    jobs: set[str] = set()
    for lsn, r in dropped:
        kind = type(r)
        if kind is NormalRecord:
            state.forget_messages(wb, lsn, r.messages, r.queue_offsets)
            if r.send_back:
                wb.delete(r.send_back, h["meta"])
        elif kind is EndRecord:
            txids.add(r.transaction_id)
            if r.queue_offsets:  # a commit indexed its messages under the half record's LSN
                half = decode_record(db.log[keys.lsn_key(r.half_lsn)])
                state.forget_messages(wb, r.half_lsn, half.messages, r.queue_offsets)
        elif kind is ParkRecord:
            txids.add(r.transaction_id)
            for prefix, offset in state._queue_entries(r):
                wb.delete(keys.cq_key(prefix, offset), h["cq"])
        elif kind in _TX_RECORDS:
            txids.add(r.transaction_id)
        elif kind is CheckRecord:
            txids.update(r.transaction_ids)
        elif kind is OffsetRecord:
            offsets.update((r.consumer_group, t, q) for t, q, _ in r.offsets)
        elif kind is TopicRecord:
            topics.add(r.name)
        elif kind is GroupSettingsRecord:
            groups.add(r.group)
        elif kind is EpochRecord:
            wb.delete(b"epoch/" + keys.lsn_key(r.epoch), h["meta"])
        elif kind in _JOB_RECORDS:
            jobs.add(r.job_id)
    _rederive_transactions(state, scratch, txids, last_kept)
    names = _rederive_jobs(state, scratch, jobs, last_kept)
    _rederive_latest(state, wb, offsets, topics, last_kept, names, groups)
    wb.delete(b"published", h["meta"])
    db.db.write(wb, sync_write_options())
    log.warning("truncated %d records after LSN %d (%d transactions, %d consumer offsets, %d topics re-derived)",
                len(dropped), last_kept, len(txids), len(offsets), len(topics))
    return len(dropped)


def _rederive_transactions(state: "StateMachine", scratch: Batch, txids: set[str], last_kept: int) -> None:
    """Each touched transaction's entry again, from its kept records (none: it is gone)."""
    if not txids:
        return
    db, h = state.db, state.db.handles
    first = last_kept + 1
    for txid in txids:
        key = txid.encode()
        scratch.wb.delete(key, h["pending"])
        scratch.wb.delete(key, h["tx"])
        state._pending.pop(txid, None)  # replaying its kept records below adds it again
        stored = db.pending.get(key)
        half_lsn = decode_pending(stored).half_lsn if stored is not None else None
        if half_lsn is None and (stored := db.tx.get(key)) is not None:
            half_lsn = decode_finished(stored).half_lsn
        if half_lsn is not None:
            first = min(first, half_lsn)
    for k, raw in state.db.log.items(from_key=keys.lsn_key(first)):
        lsn = keys.lsn_from_key(k)
        if lsn > last_kept:
            break
        r = decode_record(raw)
        kind = type(r)
        if kind in _TX_RECORDS and r.transaction_id in txids:
            state._apply(r, lsn, scratch)
        elif kind is CheckRecord and not txids.isdisjoint(r.transaction_ids):
            state._apply(CheckRecord([t for t in r.transaction_ids if t in txids], r.check_ms), lsn, scratch)


def _rederive_jobs(state: "StateMachine", scratch: Batch, job_ids: set[str], last_kept: int) -> set[str]:
    """Each touched job's entry again, from its kept records (its open record dropped: it is gone).
    Returns the touched jobs' names: which job each names is derived again from the kept log."""
    names: set[str] = set()
    if not job_ids:
        return names

    db, h = state.db, state.db.handles
    first = last_kept + 1
    for job_id in job_ids:
        key = keys.JOB_ID_PREFIX + job_id.encode()
        stored = db.jobs.get(key)
        scratch.wb.delete(key, h["jobs"])
        state.jobs.pop(job_id, None)
        if stored is None:
            continue
        j = decode_job(stored)
        if j.name:  # replaying a kept open record below re-points the name; the walk back settles it
            names.add(j.name)
        if j.open_lsn <= last_kept:
            first = min(first, j.open_lsn)
    for k, raw in db.log.items(from_key=keys.lsn_key(first)):
        lsn = keys.lsn_from_key(k)
        if lsn > last_kept:
            break
        r = decode_record(raw)
        if type(r) in _JOB_RECORDS and r.job_id in job_ids:
            state._apply(r, lsn, scratch)
    return names


def _rederive_latest(state: "StateMachine", wb: WriteBatch, offsets: set, topics: set[str], last_kept: int,
                     names: set[str] = frozenset(), groups: set[str] = frozenset()) -> None:
    """Consumer offsets, topics, job names' newest jobs and producer groups' settings as the latest
    kept record set them (walking the log back)."""
    if not offsets and not topics and not names and not groups:
        return

    h = state.db.handles
    offsets, topics, names, groups = set(offsets), set(topics), set(names), set(groups)
    it = state.db.log.iter()
    it.seek_for_prev(keys.lsn_key(last_kept))
    while it.valid() and (offsets or topics or names or groups):
        r = decode_record(it.value())
        if type(r) is OffsetRecord:
            for topic, queue, offset in r.offsets:
                if (r.consumer_group, topic, queue) in offsets:
                    offsets.discard((r.consumer_group, topic, queue))
                    wb.put(keys.offset_key(r.consumer_group, topic, queue), keys.lsn_key(offset), h["offsets"])
        elif type(r) is TopicRecord and r.name in topics:
            topics.discard(r.name)
            wb.put(b"topic/" + r.name.encode(), str(r.queue_count).encode(), h["meta"])
        elif type(r) is JobOpenRecord and r.name in names:
            names.discard(r.name)
            wb.put(keys.JOB_NAME_PREFIX + r.name.encode(), r.job_id.encode(), h["jobs"])
        elif type(r) is GroupSettingsRecord and r.group in groups:
            groups.discard(r.group)
            state._apply_group_settings(r, wb)  # the state machine's own derivation
        it.prev()
    for group in groups:  # set only by dropped records: removed
        state._apply_group_settings(GroupSettingsRecord(group, 0), wb)
    for group, topic, queue in offsets:  # set only by dropped records
        wb.delete(keys.offset_key(group, topic, queue), h["offsets"])
    for name in topics:
        wb.delete(b"topic/" + name.encode(), h["meta"])
    for name in names:
        wb.delete(keys.JOB_NAME_PREFIX + name.encode(), h["jobs"])
