"""Transactions: half messages pending or parked (the pending column family, and memory: what the
check-back scan and END_TRANSACTION walk), and decisions (the tx column family: committed or rolled
back, what a repeated END or a participant asks about).

Retention keeps the records a pending transaction is derived from (its half message and its
check, park and resume records: its lineage), and a decision while someone may still ask about
it: a spanning transaction's home keeps it until a ReleaseRecord says every participant has ended,
and any decision stays at least DECISION_FLOOR_MS after its END (a producer's retried END). A
decision also stays while its half is stored (kept as its queue's newest record, say) if entries
point into the half: a commit's queue entries, a parked transaction's entries in
TRANS_CHECK_MAX_TIME_TOPIC (committed or rolled back); only the decision says where they are when
the half goes (seed 556). Such a decision outlives
its records: listed under meta `linger/`, and expired there.

Truncation derives each transaction the dropped records touched again from its kept records
(kept by its lineage), or undoes a dropped release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txbroker.protocol.codes import TransactionState
from txbroker.protocol.properties import stored_immunity_ms
from txbroker.store import keys
from txbroker.store.derived.family import Family, RetentionPass
from txbroker.store.records import (
    COMMITTED, PARKED, PREPARED, ROLLED_BACK, CheckRecord, EndRecord, FinishedTx, HalfRecord, ParkRecord, PendingTx,
    ReleaseRecord, ResumeRecord, decode_finished, decode_pending, decode_record, encode, keys_of, runs_of,
)

if TYPE_CHECKING:
    from rocksdict import WriteBatch

    from txbroker.store.db import Database
    from txbroker.store.derived.jobs import Jobs
    from txbroker.store.derived.key_index import KeyIndex
    from txbroker.store.derived.messages import Messages
    from txbroker.store.group_commit import Batch

SPAN_PREFIX = b"span/"
LINGER_PREFIX = b"linger/"
DECISION_FLOOR_MS = 60_000
_TX_RECORDS = (HalfRecord, EndRecord, ParkRecord, ResumeRecord)


class Transactions(Family):
    def __init__(self, db: "Database", messages: "Messages", jobs: "Jobs", key_index: "KeyIndex"):
        self._db = db
        self._messages = messages
        self._key_index = key_index
        self._jobs = jobs
        self._h_pending, self._h_tx, self._h_meta = db.handles["pending"], db.handles["tx"], db.handles["meta"]
        self.pending: dict[str, PendingTx] = {}
        self._finishing: dict[str, FinishedTx] = {}  # decided by the batch not yet on disk
        # spanning transactions decided here whose participants may still ask: txid -> their groups
        self.unreleased: dict[str, list[str]] = {}

    def appliers(self):
        return {HalfRecord: self.apply_half, EndRecord: self.apply_end, CheckRecord: self.apply_check,
                ParkRecord: self.apply_park, ResumeRecord: self.apply_resume, ReleaseRecord: self.apply_release}

    # ---- memory -------------------------------------------------------------------------------------

    def load(self) -> None:
        self.pending.clear()
        self._finishing.clear()
        self.unreleased.clear()
        for _k, v in self._db.pending.items():
            p = decode_pending(v)
            self.pending[p.transaction_id] = p
        for k, _v in self._db.meta.items(from_key=SPAN_PREFIX):
            if not k.startswith(SPAN_PREFIX):
                break
            f = self.finished(k[len(SPAN_PREFIX):].decode())
            if f is not None:
                self.unreleased[f.transaction_id] = f.participants

    def written(self, b: "Batch") -> None:
        finishing = self._finishing
        for txid in b.txids:  # now in the tx column family
            finishing.pop(txid, None)

    def finished(self, transaction_id: str) -> FinishedTx | None:
        f = self._finishing.get(transaction_id)
        if f is not None:
            return f
        v = self._db.tx.get(transaction_id.encode())
        return decode_finished(v) if v is not None else None

    # ---- applying -------------------------------------------------------------------------------------

    def apply_half(self, r: HalfRecord, lsn: int, b: "Batch") -> None:
        msgs = r.messages
        first = msgs[0].properties
        p = PendingTx(
            transaction_id=r.transaction_id, producer_group=r.producer_group, half_lsn=lsn, born_ms=r.born_ms,
            immunity_ms=stored_immunity_ms({**r.properties, **first} if r.properties else first),
            job_id=r.job_id, home=r.home, participants=r.participants, runs=runs_of(msgs), keys=keys_of(msgs),
        )
        if r.job_id:
            self._jobs.member_prepared(r.job_id, r.transaction_id)
        self.pending[r.transaction_id] = p
        b.wb.put(r.transaction_id.encode(), encode(p), self._h_pending)

    def apply_end(self, r: EndRecord, lsn: int, b: "Batch") -> None:
        p = self.pending.pop(r.transaction_id)
        tid = r.transaction_id.encode()
        wb = b.wb
        wb.delete(tid, self._h_pending)
        committed = r.state == TransactionState.COMMIT
        if committed:
            self._messages.index(b, p.half_lsn, p.runs, r.queue_offsets)
            if p.keys:  # written behind the log: O(1) here for any number of keys
                self._key_index.add(lsn, p.half_lsn, p.runs, r.queue_offsets, p.keys)
        done = FinishedTx(
            transaction_id=r.transaction_id, producer_group=p.producer_group, half_lsn=p.half_lsn,
            state=COMMITTED if committed else ROLLED_BACK, end_lsn=lsn, end_ms=r.end_ms,
            message_count=p.message_count, queue_offsets=r.queue_offsets, by=r.by, checks=p.checks,
            job_id=p.job_id, participants=p.participants, parked_offsets=p.parked_offsets,
        )
        if p.job_id:
            self._jobs.member_ended(p.job_id, r.transaction_id, lsn, b)
        if p.participants:
            wb.put(SPAN_PREFIX + tid, b"", self._h_meta)
            self.unreleased[r.transaction_id] = p.participants
        wb.put(tid, encode(done), self._h_tx)
        self._finishing[r.transaction_id] = done
        b.txids.append(r.transaction_id)

    def apply_check(self, r: CheckRecord, lsn: int, b: "Batch") -> None:
        put, pending, h = b.wb.put, self.pending, self._h_pending
        for txid in r.transaction_ids:
            p = pending[txid]
            p.checks += 1
            p.last_check_ms = r.check_ms
            p.lineage.append(lsn)
            put(txid.encode(), encode(p), h)

    def apply_park(self, r: ParkRecord, lsn: int, b: "Batch") -> None:
        p = self.pending[r.transaction_id]
        p.state = PARKED
        p.last_check_ms = r.park_ms
        p.lineage.append(lsn)
        p.parked_offsets.extend(r.queue_offsets)
        b.wb.put(p.transaction_id.encode(), encode(p), self._h_pending)
        self._messages.index_parked(b, p.half_lsn, p.message_count, r.queue_offsets)

    def apply_resume(self, r: ResumeRecord, lsn: int, b: "Batch") -> None:
        p = self.pending[r.transaction_id]
        p.state = PREPARED
        p.checks = 0
        p.last_check_ms = r.resume_ms
        p.lineage.append(lsn)
        b.wb.put(p.transaction_id.encode(), encode(p), self._h_pending)

    def apply_release(self, r: ReleaseRecord, lsn: int, b: "Batch") -> None:
        for txid in r.transaction_ids:
            self.unreleased.pop(txid, None)
            f = self.finished(txid)
            if f is None or f.released_lsn:
                continue
            f.released_lsn = lsn
            tid = txid.encode()
            b.wb.put(tid, encode(f), self._h_tx)
            b.wb.delete(SPAN_PREFIX + tid, self._h_meta)
            self._finishing[txid] = f
            b.txids.append(txid)

    # ---- retention -------------------------------------------------------------------------------------

    def lineage(self):
        for p in self.pending.values():
            yield p.half_lsn
            yield from p.lineage

    def forget(self, lsn: int, record, wb: "WriteBatch", rp: RetentionPass) -> None:
        kind = type(record)
        if kind is HalfRecord:
            # decided before the mark (else it is in a lineage): its commit's index entries, and its
            # entries of the parked queue, point here
            done = self.finished(record.transaction_id)
            if done is not None and done.half_lsn == lsn:
                if done.queue_offsets:
                    self._messages.forget_messages(wb, lsn, record.messages, done.queue_offsets)
                if done.parked_offsets:
                    self._messages.forget_parked(wb, done.parked_offsets)
        elif kind is EndRecord:
            done = self.finished(record.transaction_id)
            if done is not None and done.end_lsn == lsn:
                if self._still_asked_about(done, rp) or self._indexes_a_stored_half(done, rp.kept):
                    wb.put(LINGER_PREFIX + record.transaction_id.encode(), b"", self._h_meta)
                else:
                    wb.delete(record.transaction_id.encode(), self._h_tx)
        elif kind is ParkRecord and record.transaction_id not in self.pending:
            # its entries go with its half when its decision lists them; others (a park recorded
            # before decisions listed them) go now, as they did
            done = self.finished(record.transaction_id)
            listed = set(done.parked_offsets) if done is not None else set()
            gone = [o for o in record.queue_offsets if o not in listed]
            if gone:
                self._messages.forget_parked(wb, gone)

    def _indexes_a_stored_half(self, f: FinishedTx, kept: frozenset[int] | None = None) -> bool:
        """A decision whose half outlives its END (kept as its queue's newest record, say): only the
        decision says where the half's messages are indexed, and deleting the half must find them,
        else they stay, pointing at nothing (the fault harness, seed 556). `kept`: the records the
        pass under way keeps (its deletions are not on disk yet); None: the log says."""
        if not (f.queue_offsets or f.parked_offsets):
            return False
        if kept is not None:
            return f.half_lsn in kept
        return self._db.log.get(keys.lsn_key(f.half_lsn)) is not None

    @staticmethod
    def _still_asked_about(f: FinishedTx, rp: RetentionPass) -> bool:
        """A participant may still ask (released by no record retention may act on yet), or the
        producer's retried END may still come."""
        if f.participants and not (f.released_lsn and f.released_lsn < rp.cutoff_lsn):
            return True
        return f.end_ms > rp.now_ms - DECISION_FLOOR_MS

    def expire(self, wb: "WriteBatch", rp: RetentionPass) -> int:
        gone = 0
        for k, _v in self._db.meta.items(from_key=LINGER_PREFIX):
            if not k.startswith(LINGER_PREFIX):
                break
            tid = k[len(LINGER_PREFIX):]
            f = self.finished(tid.decode())
            if f is not None and (self._still_asked_about(f, rp) or self._indexes_a_stored_half(f)):
                continue
            wb.delete(k, self._h_meta)
            if f is not None:
                wb.delete(tid, self._h_tx)
                gone += 1
        return gone

    # ---- truncation -------------------------------------------------------------------------------------

    def cut(self, dropped, last_kept: int, scratch: "Batch") -> None:
        touched: set[str] = set()
        released: set[str] = set()
        for _lsn, r in dropped:
            kind = type(r)
            if kind in _TX_RECORDS:
                touched.add(r.transaction_id)
            elif kind is CheckRecord:
                touched.update(r.transaction_ids)
            elif kind is ReleaseRecord:
                released.update(r.transaction_ids)
        self._unrelease(released - touched, scratch.wb)
        if touched:
            self._derive_again(touched, last_kept, scratch)

    def _unrelease(self, txids: set[str], wb: "WriteBatch") -> None:
        """A dropped release: the decision waits for its participants again (its records may be gone:
        the decision is the entry itself)."""
        for txid in txids:
            f = self.finished(txid)
            if f is None or not f.released_lsn:
                continue
            f.released_lsn = 0
            tid = txid.encode()
            wb.put(tid, encode(f), self._h_tx)
            wb.put(SPAN_PREFIX + tid, b"", self._h_meta)

    def _derive_again(self, txids: set[str], last_kept: int, scratch: "Batch") -> None:
        """Each touched transaction's entries again, from its kept records (none: it is gone). Its
        lineage kept them: a dropped record ended or changed a transaction pending before it, or
        one born in the tail."""
        db, wb = self._db, scratch.wb
        first = last_kept + 1
        for txid in txids:
            key = txid.encode()
            stored = db.pending.get(key)
            half_lsn = decode_pending(stored).half_lsn if stored is not None else None
            if half_lsn is None and (stored := db.tx.get(key)) is not None:
                half_lsn = decode_finished(stored).half_lsn
            wb.delete(key, self._h_pending)
            wb.delete(key, self._h_tx)
            wb.delete(SPAN_PREFIX + key, self._h_meta)
            wb.delete(LINGER_PREFIX + key, self._h_meta)
            self.pending.pop(txid, None)  # replaying its kept records below adds it again
            if half_lsn is not None:
                first = min(first, half_lsn)
        replay = {HalfRecord: self.apply_half, EndRecord: self.apply_end, ParkRecord: self.apply_park,
                  ResumeRecord: self.apply_resume}
        for k, raw in db.log.items(from_key=keys.lsn_key(first)):
            lsn = keys.lsn_from_key(k)
            if lsn > last_kept:
                break
            r = decode_record(raw)
            kind = type(r)
            if kind in replay and r.transaction_id in txids:
                replay[kind](r, lsn, scratch)
            elif kind is CheckRecord and not txids.isdisjoint(r.transaction_ids):
                self.apply_check(CheckRecord([t for t in r.transaction_ids if t in txids], r.check_ms), lsn, scratch)
            elif kind is ReleaseRecord and not txids.isdisjoint(r.transaction_ids):
                self.apply_release(r, lsn, scratch)
