"""Coordinated transactions ("jobs"): the decision lives in the broker's log, so the broker ends
the members itself and nobody has to answer check-backs for them.

A coordinator (a Spark driver, any program) opens a job with a producer group and a deadline;
producers send half messages that name it (SendRequest.job_id), in any number of ordinary
transactions; one DECIDE_JOB records COMMIT with the exact list of member transactions to keep, or
ABORT. The decision is one log record, acknowledged as every write is (flushed as configured,
replicated as configured); the first decision wins and the opposite one is refused naming it.

Then the broker ends each member (EndRecord by "job": committed members visible exactly once,
the others rolled back), in slices so the event loop keeps serving. The members of an undecided
job are never checked back; at the deadline the broker records ABORT itself. A master that takes
over (promotion, restart) finishes the members of every job already decided, so a decision is
never lost between its record and the members' visibility.

Optional two-phase form (KIP-939's prepare): PREPARE_JOB fixes the member list first, and a later
COMMIT without a list keeps exactly it (Spark's deferred commit: the application decides).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

from txbroker.broker.metrics import BrokerMetrics
from txbroker.broker.replies import Reply, RequestError, error, ok
from txbroker.broker.role import RoleState
from txbroker.broker.transaction.service import TransactionService, now_ms
from txbroker.lifecycle import stop_task
from txbroker.protocol.bodies import DecideJobRequest, JobInfo, OpenJobRequest, PrepareJobRequest, QueryJobRequest
from txbroker.protocol.codes import ResponseCode, TransactionState
from txbroker.protocol.names import JOB_ID, JOB_ID_RULE, JOB_NAME, JOB_NAME_RULE
from txbroker.store.records import (
    JOB_ABORTED, JOB_COMMITTED, JOB_OPEN, JOB_PREPARED, JobDecisionRecord, JobOpenRecord, JobPrepareRecord, JobState,
)
from txbroker.store.derived.jobs import PREPARED_TIMEOUT_MS
from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)

MIN_TIMEOUT_MS = 1_000
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000
MAX_MEMBERS = 1_000_000
# Members ended per loop iteration (one group-commit batch each): at most this many transactions,
# or messages (a commit indexes each message: 1,000 members of 1,000 keyed messages in one go held
# the loop for 2.2 s).
RESOLVE_SLICE = 1000
RESOLVE_SLICE_MESSAGES = 20_000
DEADLINE_TICK_S = 0.25


def check_job_id(job_id: str) -> None:
    if not JOB_ID.fullmatch(job_id or ""):
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                           f"malformed job id {job_id[:140]!r}: {JOB_ID_RULE} (what OPEN_JOB answered)")


class JobService:
    def __init__(self, state: StateMachine, transactions: TransactionService, role: RoleState, metrics: BrokerMetrics,
                 cluster=None):
        self._state = state
        self._tx = transactions
        self._role = role
        self._metrics = metrics
        self._cluster = cluster  # broker/cluster.py: the groups a job may span
        self.groups = None  # job_groups.JobGroups: jobs spanning broker groups (set by the broker)
        self._task: asyncio.Task | None = None
        self._resolving: dict[str, asyncio.Task] = {}
        # job id -> (its stamp, when this broker first saw it ahead of its clock): see _expired
        self._stamped_ahead: dict[str, tuple[int, int]] = {}

    # ---- requests --------------------------------------------------------------------------------

    def open(self, req: OpenJobRequest) -> Reply:
        self._role.require_master()
        if not req.producer_group:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "a job needs a producer group")
        if req.home:
            return self._open_on_member_group(req)
        if not MIN_TIMEOUT_MS <= req.timeout_ms <= MAX_TIMEOUT_MS:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                               f"job timeout {req.timeout_ms} ms out of range: {MIN_TIMEOUT_MS}..{MAX_TIMEOUT_MS} ms")
        if req.prepared_timeout_ms and not MIN_TIMEOUT_MS <= req.prepared_timeout_ms <= MAX_TIMEOUT_MS:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"prepared job timeout {req.prepared_timeout_ms} ms out "
                                                             f"of range: {MIN_TIMEOUT_MS}..{MAX_TIMEOUT_MS} ms")
        groups = list(dict.fromkeys(req.groups))
        for group in groups:
            self._require_cluster().check_other_group(group, "member")
        if req.name:
            if not JOB_NAME.fullmatch(req.name):
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                                   f"malformed job name {req.name[:100]!r}: {JOB_NAME_RULE}")
            newest = self._state.job_named(req.name)
            if newest is not None:
                self._same_group(newest, req.producer_group)
                if self._expired(newest):
                    self._abort_expired(newest)
                elif newest.state != JOB_ABORTED:
                    return self._answer(newest, already=True)
        if self._cluster is not None and self._cluster.draining:  # no new work on a group that is leaving
            self._cluster.refuse_draining()
        t = now_ms()
        group = self._cluster.group if self._cluster is not None and self._cluster.route is not None else ""
        # unique in the cluster: a job spanning groups has an entry of this id on each of them
        job_id = f"{req.name or 'job'}.{group + '.' if group else ''}e{self._state.epoch}.{self._state.next_lsn}"
        _lsn, durable = self._state.append(JobOpenRecord(job_id, req.producer_group, t, t + req.timeout_ms, req.name,
                                                         groups=groups, prepared_timeout_ms=req.prepared_timeout_ms))
        self._metrics.jobs_opened.inc()
        return self._when_published(self._state.jobs[job_id], durable)

    def _open_on_member_group(self, req: OpenJobRequest) -> Reply:
        """The entry of a job spanning groups on a group that holds members (not its home): members
        join it here; it has no deadline of its own and ends as the home decides (job_groups.py)."""
        self._require_cluster().check_home(req.home)
        check_job_id(req.job_id)
        if req.name:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"job {req.job_id}: a name belongs to the job at its home "
                                                             f"group {req.home}, not to its entry here")
        j = self._state.job(req.job_id)
        if j is not None:
            self._same_group(j, req.producer_group)
            if j.home != req.home:
                raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                                   f"job {j.job_id} is here already, " + (f"decided by group {j.home}" if j.home else
                                                                         "as a job of this group"))
            return self._answer(j, already=True)
        self._require_cluster().refuse_if_home_leaving(req.home, f"job {req.job_id}")
        _lsn, durable = self._state.append(JobOpenRecord(req.job_id, req.producer_group, now_ms(), 0, home=req.home))
        self._metrics.jobs_opened.inc()
        return self._when_published(self._state.jobs[req.job_id], durable)

    def _require_cluster(self):
        if self._cluster is None or self._cluster.route is None:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "this broker belongs to no cluster of broker groups "
                                                             "(no --cluster-file): a job cannot span groups here")
        return self._cluster

    def prepare(self, req: PrepareJobRequest) -> Reply:
        self._role.require_master()
        j = self._find(req.job_id, req.producer_group)
        self._not_on_member_group(j, "PREPARE_JOB")
        members = list(dict.fromkeys(req.members))
        remote = self._remote(j, req.remote)
        if j.state == JOB_PREPARED or j.decided:
            if j.state in (JOB_PREPARED, JOB_COMMITTED) and members == j.members and remote == j.remote:
                return self._answer(j, already=True)
            return self._refuse_decided(j, f"prepare {len(members)} members")
        self._deadline_passed(j)
        self._check_members(j, members)
        _lsn, durable = self._state.append(JobPrepareRecord(j.job_id, members, now_ms(), remote))
        return self._when_published(j, durable)

    def _not_on_member_group(self, j: JobState, what: str) -> None:
        if j.home:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION, f"job {j.job_id} is decided by its home group {j.home}: "
                                                               f"send {what} there")

    def _remote(self, j: JobState, remote: dict[str, list[str]] | None) -> dict[str, list[str]]:
        """Members on other groups, each group one the job was opened with; not checked here (their
        groups hold them), only counted."""
        out = {g: list(dict.fromkeys(ids)) for g, ids in (remote or {}).items() if ids}
        for g in out:
            if g not in j.groups:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"job {j.job_id}: members named on group {g[:64]!r}, "
                                   f"which the job was not opened with (its groups: {', '.join(j.groups) or 'none'})")
        if sum(len(ids) for ids in out.values()) > MAX_MEMBERS:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"more than {MAX_MEMBERS} members on other groups")
        return out

    def decide(self, req: DecideJobRequest, by: str = "client") -> Reply:
        self._role.require_master()
        try:
            wanted = TransactionState(req.state)
        except ValueError:
            wanted = TransactionState.UNKNOWN
        if wanted == TransactionState.UNKNOWN:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"a job's decision is 1 COMMIT or 2 ABORT, not {req.state}")
        j = self._find(req.job_id, req.producer_group, any_group=by == "admin")
        if j.home:  # a member group's entry: it ends as the home decided; asked now
            return self.groups.follow_now(j)
        commit = wanted == TransactionState.COMMIT
        remote: dict[str, list[str]] = {}
        if commit:
            members = list(dict.fromkeys(req.members)) if req.members is not None else None
            if members is None:
                if j.state == JOB_OPEN and (by != "admin" or j.spans):
                    raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                                       f"job {j.job_id} is OPEN: COMMIT needs the list of member transactions to keep "
                                       + ("on every group it spans " if j.spans else "") + "(or PREPARE_JOB it first)")
                members = list(j.members) if j.state != JOB_OPEN else sorted(self._state.job_members.get(j.job_id, ()))
                remote = dict(j.remote)
            else:
                remote = self._remote(j, req.remote)
        else:
            members = []
        if j.decided:
            if (j.state == JOB_COMMITTED) == commit and (not commit or (members, remote) == (j.members, j.remote)):
                return self._answer(j, already=True)
            return self._refuse_decided(j, "COMMIT" if commit else "ABORT")
        if commit:
            self._deadline_passed(j)
            if j.state == JOB_PREPARED and (members, remote) != (j.members, j.remote):
                raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                                   f"job {j.job_id} was prepared with {len(j.members)} members"
                                   + (f" here and {sum(map(len, j.remote.values()))} on other groups" if j.spans else "")
                                   + f"; COMMIT must keep exactly those (got {len(members)})")
            self._check_members(j, members)
        _lsn, durable = self._state.append(JobDecisionRecord(j.job_id, int(wanted), now_ms(), members, by, remote))
        self._decided(j, by)
        return self._when_published(j, durable)

    def query(self, req: QueryJobRequest) -> Reply:
        if req.name:
            j = self._state.job_named(req.name)
            if j is None:
                return error(ResponseCode.QUERY_NOT_FOUND, f"no job named {req.name!r} on this broker")
            if req.producer_group:  # (the admin plane asks for none: any group's)
                self._same_group(j, req.producer_group)
        else:
            j = self._find(req.job_id, req.producer_group, any_group=not req.producer_group)
        return ok(self.info(j))

    def info(self, j: JobState, already: bool = False) -> JobInfo:
        """The job as every request answers it: as published, so nothing it says can be taken back by a
        failover (a decision no slave holds yet reads as the state before it); resolved once the
        decision and every member's end are published."""
        durable = self._state.durable_lsn
        state, members, decided_ms, by = j.state, len(j.members), j.decided_ms, j.by
        if j.decided and j.decision_lsn > durable:
            state = JOB_PREPARED if j.prepare_lsn and j.prepare_lsn <= durable else JOB_OPEN
            members, decided_ms, by = (members if state == JOB_PREPARED else 0), 0, ""
        elif state == JOB_PREPARED and j.prepare_lsn > durable:
            state, members = JOB_OPEN, 0
        pending = self._pending(j)
        resolved = state in (JOB_COMMITTED, JOB_ABORTED) and not pending and max(j.decision_lsn, j.ended_lsn) <= durable
        unresolved = self.groups.unresolved(j) if j.spans and state in (JOB_COMMITTED, JOB_ABORTED) else list(j.groups)
        if j.spans:  # at the home: resolved once every group has ended its members as decided
            resolved = resolved and not unresolved
        return JobInfo(j.job_id, j.producer_group, state, j.open_ms, j.deadline_ms, j.name, members, pending,
                       decided_ms, by, already, resolved, j.home, j.groups,
                       j.prepared_deadline_ms if state == JOB_PREPARED else 0, unresolved)

    async def _when_published(self, j: JobState, written: asyncio.Future | None, already: bool = False) -> Reply:
        """The answer to a change of `j` (or a repeat of one): once it is published, as it then stands.
        If it cannot be published now (no slave in sync), that refusal (the change may yet be lost)."""
        if written is not None:
            await written
        return ok(self.info(j, already))

    async def answer_published(self, j: JobState) -> Reply:
        """`j` as it stands, once what it records is published."""
        return await self._when_published(j, self._published(j))

    def _published(self, j: JobState) -> asyncio.Future | None:
        """None if what `j` records is published; else a future for it."""
        return self._state.published_future(max(j.decision_lsn, j.prepare_lsn, j.open_lsn))

    # ---- checks ----------------------------------------------------------------------------------

    def _find(self, job_id: str, group: str, any_group: bool = False) -> JobState:
        check_job_id(job_id)
        j = self._state.job(job_id)
        if j is None:
            raise RequestError(ResponseCode.QUERY_NOT_FOUND, f"no job {job_id!r} on this broker")
        if not any_group:
            self._same_group(j, group)
        return j

    @staticmethod
    def _same_group(j: JobState, group: str) -> None:
        if j.producer_group != group:
            raise RequestError(ResponseCode.TRANSACTION_STATE_GROUP_WRONG,
                               f"job {j.job_id} belongs to producer group {j.producer_group!r}, not {group!r}")

    def _expired(self, j: JobState) -> bool:
        """Past its bound undecided: an OPEN job's deadline, a PREPARED one's longer bound (a slow
        coordinator never loses prepared work to the OPEN deadline). A member group's entry has none:
        its home decides. A bound stamped by a clock ahead of this one (set back since, or another
        master's running fast) runs from when this broker first saw the stamp ahead, not from when
        its clock catches up (the fault harness, seed 274 run again: a job opened under a clock
        120 s ahead stayed open 120 s past its deadline, as check-back's stamps did before e098c77)."""
        if j.decided or j.home:
            return False
        if j.state == JOB_PREPARED:
            bound, stamp = j.prepared_deadline_ms, j.prepared_deadline_ms - (j.prepared_timeout_ms or PREPARED_TIMEOUT_MS)
        else:
            bound, stamp = j.deadline_ms, j.open_ms
        now = now_ms()
        seen = self._stamped_ahead.get(j.job_id)
        if seen is None or seen[0] != stamp:
            if stamp <= now:
                return now >= bound
            seen = self._stamped_ahead[j.job_id] = (stamp, now)
        return now - seen[1] >= bound - stamp

    def _deadline_passed(self, j: JobState) -> None:
        """A decision after the deadline: the deadline's ABORT is recorded (first decision wins) and
        the caller is refused."""
        if self._expired(j):
            self._abort_expired(j)
            raise RequestError(ResponseCode.TRANSACTION_SHOULD_ROLLBACK,
                               f"job {j.job_id} passed its deadline undecided and was ABORTED by the broker")

    def _check_members(self, j: JobState, members: list[str]) -> None:
        """Every member named must be a transaction of this job still pending (all checked before
        anything is written: a bad list changes nothing)."""
        if len(members) > MAX_MEMBERS:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"{len(members)} members; at most {MAX_MEMBERS}")
        ours = self._state.job_members.get(j.job_id, set())
        for txid in members:
            if txid in ours:
                continue
            t = self._state.pending_transaction(txid) or self._state.finished(txid)
            if t is None:
                raise RequestError(ResponseCode.QUERY_NOT_FOUND,
                                   f"job {j.job_id}: no transaction {txid[:140]!r} on this broker")
            if t.job_id != j.job_id:
                raise RequestError(ResponseCode.ILLEGAL_OPERATION, f"transaction {txid} is not a member of job "
                                   f"{j.job_id}" + (f" but of job {t.job_id}" if t.job_id else " (it joined no job)"))
            # a pending member of this job is in `ours`: this one has ended already
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"job {j.job_id}: member {txid} was already {t.state} by its {t.by}")

    def _refuse_decided(self, j: JobState, wanted: str):
        """A refusal naming the decision (or the prepare) taken: given once that is published, so no
        failover takes back what it names; until then it waits, and fails as a write would now."""
        code = ResponseCode.TRANSACTION_SHOULD_COMMIT if j.state == JOB_COMMITTED else ResponseCode.TRANSACTION_SHOULD_ROLLBACK
        if j.state == JOB_PREPARED:
            code = ResponseCode.ILLEGAL_OPERATION
        refusal = error(code, f"job {j.job_id} was already {j.state} ({len(j.members)} members, by {j.by or 'client'}); "
                              f"{wanted} refused")
        unpublished = self._published(j)
        return refusal if unpublished is None else self._after(unpublished, refusal)

    @staticmethod
    async def _after(written: asyncio.Future, reply: Reply) -> Reply:
        await written
        return reply

    def _pending(self, j: JobState) -> int:
        return len(self._state.job_members.get(j.job_id, ()))

    def _answer(self, j: JobState, already: bool):
        return self._when_published(j, self._published(j), already)

    # ---- the broker's own work: deadlines and resolving members -------------------------------------

    def start(self) -> None:
        """On the master: finish every decided job's members, then watch deadlines."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="jobs")

    async def stop(self) -> None:
        for t in list(self._resolving.values()):
            t.cancel()
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        undecided = set(self._state.jobs)
        leftovers = [job_id for job_id in self._state.job_members if job_id not in undecided]
        if leftovers:
            log.warning("finishing the members of %d decided jobs (decided before this broker led)", len(leftovers))
        for job_id in leftovers:
            self._resolve(self._state.job(job_id))
        while True:
            await asyncio.sleep(DEADLINE_TICK_S)
            try:
                self.expire()
            except Exception:  # a failed pass must not end deadline watching for good
                log.exception("job deadline pass failed; retrying")

    def expire(self) -> int:
        """ABORT every undecided job past its deadline; returns how many."""
        if not self._role.is_master:
            return 0
        late = [j for j in self._state.jobs.values() if self._expired(j)]
        for j in late:
            self._abort_expired(j)
        if self._stamped_ahead:
            for job_id in [k for k in self._stamped_ahead if k not in self._state.jobs]:
                del self._stamped_ahead[job_id]
        return len(late)

    def _abort_expired(self, j: JobState) -> None:
        log.warning("job %s of group %s passed its %s undecided: ABORT, rolling back its %d members", j.job_id,
                    j.producer_group, "prepared bound" if j.state == JOB_PREPARED else "deadline", self._pending(j))
        self._state.append(JobDecisionRecord(j.job_id, int(TransactionState.ROLLBACK), now_ms(), [], "deadline"))
        self._decided(j, "deadline")

    def decided(self, j: JobState, by: str) -> None:
        """A decision was just appended (here, or followed from the home): end the members."""
        self._decided(j, by)

    def _decided(self, j: JobState, by: str) -> None:
        self._metrics.jobs_decided.labels("commit" if j.state == JOB_COMMITTED else "abort", by).inc()
        self._resolve(j)

    def _resolve(self, j: JobState) -> None:
        if j is None or j.job_id in self._resolving:
            return
        t = asyncio.get_running_loop().create_task(self._end_members(j), name=f"job {j.job_id}")
        self._resolving[j.job_id] = t
        t.add_done_callback(lambda _t, job_id=j.job_id: self._resolving.pop(job_id, None))

    async def _end_members(self, j: JobState) -> None:
        t0 = time.perf_counter()
        keep = set(j.members) if j.state == JOB_COMMITTED else set()
        pending = self._state.pending_transaction
        members = self._state.job_members.get(j.job_id, set())
        ended = {"commit": 0, "rollback": 0}
        last = None
        while members and self._role.is_master:
            messages = 0
            for txid in list(itertools.islice(members, RESOLVE_SLICE)):
                p = pending(txid)
                if p is None:  # ended meanwhile (a member's own END agreeing with the decision)
                    members.discard(txid)
                    continue
                commit = txid in keep
                _offsets, last = self._tx.finish(p, TransactionState.COMMIT if commit else TransactionState.ROLLBACK,
                                                 "job")
                ended["commit" if commit else "rollback"] += 1
                messages += p.message_count
                if messages >= RESOLVE_SLICE_MESSAGES:
                    break
            await asyncio.sleep(0)  # that slice is one group-commit batch; let requests in between
        for outcome, n in ended.items():
            if n:
                self._metrics.job_members_ended.labels(outcome).inc(n)
        if last is not None:
            try:
                await last
            except Exception as e:  # noqa: BLE001 - written locally; published when the slaves have it
                log.warning("job %s: members ended, not yet acknowledged by the slaves (%s)", j.job_id, e)
                return
        self._metrics.job_decision_to_visible.observe(max(now_ms() - j.decided_ms, 0) / 1000)
        log.info("job %s %s: %d members committed, %d rolled back in %.3fs", j.job_id, j.state, ended["commit"],
                 ended["rollback"], time.perf_counter() - t0)

    def counts(self) -> dict[str, int]:
        return {"open": sum(1 for j in self._state.jobs.values() if j.state == JOB_OPEN),
                "prepared": sum(1 for j in self._state.jobs.values() if j.state == JOB_PREPARED)}
