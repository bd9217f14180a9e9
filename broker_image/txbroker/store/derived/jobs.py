"""Jobs (coordinated transactions): each job's entry (jobs column family, `id/`), the newest job of
each name (`name/`), decided jobs in decision order (`decided/`, for their expiry), and in memory
the undecided jobs and each job's members still pending.

Retention keeps an undecided job's open and prepare records (its lineage: truncation derives it
again from them). A decided job outlives its records: it goes once its decision has left the log
and `job_retention_ms` has passed since it (and every member has ended), its name with it if the
name still names it. Until then a replay by name finds it (Kafka keeps a transactional id as long,
transactional.id.expiration.ms: 7 days).

Truncation derives a job the dropped records opened, prepared or decided again from its kept
records; a name a dropped open moved goes back to the job it named before (`previous`); a job
whose last member's end was dropped is resolving again.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from txbroker.protocol.codes import TransactionState
from txbroker.store import keys
from txbroker.store.derived.family import Family, RetentionPass
from txbroker.store.records import (
    JOB_ABORTED, JOB_COMMITTED, JOB_PREPARED, EndRecord, JobDecisionRecord, JobOpenRecord, JobPrepareRecord,
    JobState, ReleaseRecord, decode_finished, decode_job, decode_record, encode,
)

if TYPE_CHECKING:
    from rocksdict import WriteBatch

    from txbroker.store.db import Database
    from txbroker.store.group_commit import Batch

DECIDED_PREFIX = b"decided/"
JOB_RETENTION_MS = 7 * 24 * 3600 * 1000
PREPARED_TIMEOUT_MS = 24 * 3600 * 1000  # a PREPARED job's bound, unless its opener said otherwise
_MS = struct.Struct(">Q")
_JOB_RECORDS = (JobOpenRecord, JobPrepareRecord, JobDecisionRecord)


def _decided_key(j: JobState) -> bytes:
    return DECIDED_PREFIX + _MS.pack(max(j.decided_ms, 0)) + j.job_id.encode()


class Jobs(Family):
    def __init__(self, db: "Database", messages, job_retention_ms: int = JOB_RETENTION_MS):
        self._db = db
        self._messages = messages  # the messages family: a committed job holds readers back (read whole)
        self._h_jobs = db.handles["jobs"]
        self.job_retention_ms = job_retention_ms
        self.jobs: dict[str, JobState] = {}  # the undecided ones
        self.unreleased: set[str] = set()  # decided jobs spanning groups, some group not yet done with them
        self.newest_spanning_decision = 0  # LSN of the newest decision of a job spanning groups (at its home)
        self.job_members: dict[str, set[str]] = {}  # each job's members still pending
        self._writing: dict[bytes, JobState | str] = {}  # entries of the batch not yet on disk
        self.transactions = None  # the transactions family (set by the state machine): members' destinations
        self._replaying: dict[str, str] | None = None  # during a truncation: job id -> its `previous`

    def appliers(self):
        return {JobOpenRecord: self.apply_open, JobPrepareRecord: self.apply_prepare,
                JobDecisionRecord: self.apply_decision, ReleaseRecord: self.apply_release}

    # ---- memory -----------------------------------------------------------------------------------

    def load(self) -> None:
        self.jobs.clear()
        self.job_members.clear()
        self.unreleased.clear()
        self.newest_spanning_decision = 0
        self._writing.clear()
        for p in self.transactions.pending.values():
            if p.job_id:
                self.job_members.setdefault(p.job_id, set()).add(p.transaction_id)
        for j in self._stored():
            if not j.decided:
                self.jobs[j.job_id] = j
                self.job_members.setdefault(j.job_id, set())
            else:
                if j.state == JOB_COMMITTED and self.job_members.get(j.job_id):
                    self._hold_again(j)
                if j.spans:
                    self.newest_spanning_decision = max(self.newest_spanning_decision, j.decision_lsn)
                    if not j.released_lsn:
                        self.unreleased.add(j.job_id)

    def _hold_again(self, j: JobState) -> None:
        """After a restart: a committed job still being resolved holds its queues where its first
        kept member went (ended ones from their offsets, pending ones from their queues' ends)."""
        pending, finished = self.transactions.pending, self.transactions.finished
        queues = set()
        for txid in j.members:
            p = pending.get(txid)
            if p is not None:
                queues.update((t, q) for t, q, _n in p.runs)
                continue
            f = finished(txid)
            if f is None or not f.queue_offsets:
                continue
            raw = self._db.log.get(keys.lsn_key(f.half_lsn))
            if raw is None:  # retention deleted its messages (within its decision's linger): nothing to hold
                continue
            half = decode_record(raw)
            for m, offset in zip(half.messages, f.queue_offsets):
                self._messages.hold_at(j.job_id, keys.queue_prefix(m.topic, m.queue_id), offset)
        if queues:
            self._messages.hold(j.job_id, queues)

    def _stored(self):
        for k, v in self._db.jobs.items(from_key=keys.JOB_ID_PREFIX):
            if not k.startswith(keys.JOB_ID_PREFIX):
                break
            yield decode_job(v)

    def written(self, b: "Batch") -> None:
        if self._writing:  # written synchronously: nothing of a later batch is in it yet
            self._writing.clear()

    def job(self, job_id: str) -> JobState | None:
        """A job in any state (undecided ones from memory)."""
        j = self.jobs.get(job_id)
        if j is not None:
            return j
        key = keys.JOB_ID_PREFIX + job_id.encode()
        j = self._writing.get(key)
        if j is not None:
            return j
        v = self._db.jobs.get(key)
        return decode_job(v) if v is not None else None

    def job_named(self, name: str) -> JobState | None:
        """The newest job opened under `name`."""
        key = keys.JOB_NAME_PREFIX + name.encode()
        job_id = self._writing.get(key)
        if job_id is None:
            v = self._db.jobs.get(key)
            job_id = v.decode() if v is not None else None
        return self.job(job_id) if job_id is not None else None

    def iter_jobs(self):
        """Every job, oldest id first (decided ones from disk: the admin plane's listing)."""
        for k, v in self._db.jobs.items(from_key=keys.JOB_ID_PREFIX):
            if not k.startswith(keys.JOB_ID_PREFIX):
                break
            job_id = k[len(keys.JOB_ID_PREFIX):].decode()
            yield self.jobs.get(job_id) or self._writing.get(k) or decode_job(v)

    # ---- applying -----------------------------------------------------------------------------------

    def _put(self, b: "Batch", j: JobState) -> None:
        key = keys.JOB_ID_PREFIX + j.job_id.encode()
        b.wb.put(key, encode(j), self._h_jobs)
        self._writing[key] = j

    def _name(self, b: "Batch", name: str, job_id: str) -> None:
        key = keys.JOB_NAME_PREFIX + name.encode()
        b.wb.put(key, job_id.encode(), self._h_jobs)
        self._writing[key] = job_id

    def apply_open(self, r: JobOpenRecord, lsn: int, b: "Batch") -> None:
        replaying = self._replaying
        if replaying is not None:  # a truncation derives the job again: its name stays where it is
            previous = replaying.get(r.job_id, "")
        else:
            newest = self.job_named(r.name) if r.name else None
            previous = newest.job_id if newest is not None else ""
        j = JobState(r.job_id, r.producer_group, r.open_ms, r.deadline_ms, lsn, r.name, previous=previous,
                     home=r.home, groups=r.groups, prepared_timeout_ms=r.prepared_timeout_ms)
        self.jobs[j.job_id] = j
        self.job_members.setdefault(j.job_id, set())
        self._put(b, j)
        if j.name and replaying is None:
            self._name(b, j.name, j.job_id)

    def apply_prepare(self, r: JobPrepareRecord, lsn: int, b: "Batch") -> None:
        j = self.job(r.job_id)
        j.state = JOB_PREPARED
        j.members = r.members
        j.remote = r.remote
        j.prepare_lsn = lsn
        j.prepared_deadline_ms = r.prepare_ms + (j.prepared_timeout_ms or PREPARED_TIMEOUT_MS)
        self._put(b, j)

    def apply_decision(self, r: JobDecisionRecord, lsn: int, b: "Batch") -> None:
        j = self.job(r.job_id)
        self.jobs.pop(j.job_id, None)
        j.state = JOB_COMMITTED if r.state == TransactionState.COMMIT else JOB_ABORTED
        j.members = r.members
        j.remote = r.remote
        j.decided_ms, j.by, j.decision_lsn = r.decided_ms, r.by, lsn
        pending = self.job_members.get(j.job_id)
        if not pending:
            self.job_members.pop(j.job_id, None)
        elif j.state == JOB_COMMITTED:  # read whole: its queues stop where its first member goes
            members = self.transactions.pending
            queues = {(t, q) for txid in r.members if (p := members.get(txid)) is not None for t, q, _n in p.runs}
            if queues:
                self._messages.hold(j.job_id, queues)
        self._put(b, j)
        b.wb.put(_decided_key(j), b"", self._h_jobs)
        if j.spans:
            self.unreleased.add(j.job_id)
            self.newest_spanning_decision = lsn

    def apply_release(self, r: ReleaseRecord, lsn: int, b: "Batch") -> None:
        for job_id in r.job_ids:
            self.unreleased.discard(job_id)
            j = self.job(job_id)
            if j is not None and not j.released_lsn:
                j.released_lsn = lsn
                self._put(b, j)

    def member_prepared(self, job_id: str, txid: str) -> None:
        self.job_members.setdefault(job_id, set()).add(txid)

    def member_ended(self, job_id: str, txid: str, lsn: int, b: "Batch") -> None:
        members = self.job_members.get(job_id)
        if members is None:
            return
        members.discard(txid)
        if not members and job_id not in self.jobs:  # decided, and every member ended
            del self.job_members[job_id]
            j = self.job(job_id)
            if j is not None:
                j.ended_lsn = lsn
                self._put(b, j)
            self._messages.release_when_published(job_id, lsn)

    # ---- retention -------------------------------------------------------------------------------------

    def lineage(self):
        for j in self.jobs.values():  # undecided (here: a job spanning groups until it followed its home)
            yield j.open_lsn
            if j.prepare_lsn:
                yield j.prepare_lsn

    def expire(self, wb: "WriteBatch", rp: RetentionPass) -> int:
        """Decided jobs whose decision left the log more than job_retention_ms after it was taken."""
        h, gone = self._h_jobs, 0
        before = rp.now_ms - self.job_retention_ms
        for k, _v in self._db.jobs.items(from_key=DECIDED_PREFIX):
            if not k.startswith(DECIDED_PREFIX) or _MS.unpack_from(k, len(DECIDED_PREFIX))[0] > before:
                break
            job_id = k[len(DECIDED_PREFIX) + _MS.size:].decode()
            j = self.job(job_id)
            if j is not None and (j.decision_lsn >= rp.cutoff_lsn or job_id in self.job_members
                                  or (j.spans and not (j.released_lsn and j.released_lsn < rp.cutoff_lsn))):
                continue  # its decision is still in the log, members are still being ended, or asked about
            wb.delete(k, h)
            if j is None:
                continue
            wb.delete(keys.JOB_ID_PREFIX + job_id.encode(), h)
            if j.name:
                name_key = keys.JOB_NAME_PREFIX + j.name.encode()
                if self._db.jobs.get(name_key) == job_id.encode():
                    wb.delete(name_key, h)
            gone += 1
        return gone

    # ---- truncation ----------------------------------------------------------------------------------

    def cut(self, dropped, last_kept: int, scratch: "Batch") -> None:
        db, wb, h = self._db, scratch.wb, self._h_jobs
        touched: set[str] = set()
        first_open: dict[str, str] = {}  # name -> the first job a dropped record opened under it
        undone: dict[str, JobState] = {}  # decided jobs a dropped member end or release changed
        for _lsn, r in dropped:
            kind = type(r)
            if kind is ReleaseRecord:
                for job_id in r.job_ids:
                    undone.setdefault(job_id, self.job(job_id))
            elif kind in _JOB_RECORDS:
                touched.add(r.job_id)
                if kind is JobOpenRecord and r.name:
                    first_open.setdefault(r.name, r.job_id)
            elif kind is EndRecord:
                stored = db.tx.get(r.transaction_id.encode())
                if stored is not None and (job_id := decode_finished(stored).job_id):
                    undone.setdefault(job_id, self.job(job_id))
        for job_id, j in undone.items():
            if j is None or job_id in touched:
                continue
            if j.ended_lsn > last_kept:  # its last member's end dropped: resolving again
                j.ended_lsn = 0
            if j.released_lsn > last_kept:  # its release dropped: some group is not done with it after all
                j.released_lsn = 0
            wb.put(keys.JOB_ID_PREFIX + job_id.encode(), encode(j), h)
        previous = {name: getattr(self.job(job_id), "previous", "") for name, job_id in first_open.items()}
        if touched:
            self._derive_again(touched, last_kept, scratch)
        for name, before in previous.items():  # the name goes back to what it named before
            name_key = keys.JOB_NAME_PREFIX + name.encode()
            if before and db.jobs.get(keys.JOB_ID_PREFIX + before.encode()) is not None:
                wb.put(name_key, before.encode(), h)
            else:
                wb.delete(name_key, h)

    def _derive_again(self, job_ids: set[str], last_kept: int, scratch: "Batch") -> None:
        """Each touched job's entry again from its kept records (its open record dropped: it is
        gone). A dropped record changed a job undecided before it, whose lineage kept its records.
        Names are not moved by the replay: only a dropped open moved one (settled by the caller)."""
        db, wb, h = self._db, scratch.wb, self._h_jobs
        first = last_kept + 1
        self._replaying = {}
        for job_id in job_ids:
            key = keys.JOB_ID_PREFIX + job_id.encode()
            j = self.job(job_id)
            wb.delete(key, h)
            self.jobs.pop(job_id, None)
            if j is None:
                continue
            self._replaying[job_id] = j.previous
            if j.decided:
                wb.delete(_decided_key(j), h)
            if j.open_lsn <= last_kept:
                first = min(first, j.open_lsn)
        replay = self.appliers()
        try:
            for k, raw in db.log.items(from_key=keys.lsn_key(first)):
                lsn = keys.lsn_from_key(k)
                if lsn > last_kept:
                    break
                r = decode_record(raw)
                if type(r) in _JOB_RECORDS and r.job_id in job_ids:
                    replay[type(r)](r, lsn, scratch)
        finally:
            self._replaying = None
