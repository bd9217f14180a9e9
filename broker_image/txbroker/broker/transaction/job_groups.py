"""Jobs that span broker groups: one decision, in the log of the job's home group; the members on
the other groups end only as the home decided (as the participants of a spanning transaction do).

  coordinator   opens the job at its home naming the other groups (OPEN_JOB groups=...), then the
                job's entry on each of them (OPEN_JOB home=..., job_id=...); members join the entry
                of the group they are stored on; the decision goes to the home only, naming the
                members kept on each other group (DECIDE_JOB remote=...); a DECIDE_JOB sent to a
                member group after it just makes that group ask its home at once.
  member group  never decides: its entry has no deadline. Every tick (and at once when told), its
                master asks the home's master how the decision treats its pending members
                (QUERY_JOB_MEMBERS, answered as published), and records the home's decision as
                its own (JobDecisionRecord by "home"): from there its members end as any job's do,
                read whole. A home that does not know the job (UNKNOWN: lost in an ASYNC failover,
                or expired) never will: after a few such answers the members are parked, for an
                operator.
  home          keeps the decision while a member group may still ask: every tick its master asks
                each member group of a decided job whether it has resolved it (QUERY_JOB), and once
                every one has (or has left the route) records a release (ReleaseRecord job_ids);
                only then may the job expire. A job at its home is `resolved` once every group is.

A deadline abort at the home reaches every group the same way: it is the home's decision.
"""

from __future__ import annotations

import asyncio
import logging

from txbroker.broker.cluster import ClusterMembership
from txbroker.broker.replies import Reply, error, ok
from txbroker.broker.role import RoleState
from txbroker.broker.transaction.service import TransactionService, now_ms
from txbroker.broker.transaction.settings import SettingsBook
from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.log_limit import RepeatedWarnings
from txbroker.lifecycle import stop_task
from txbroker.protocol.bodies import (
    JobInfo, JobMembersRequest, JobMembersResponse, JobsSettledResponse, QueryJobRequest,
)
from txbroker.protocol.codes import RequestCode, ResponseCode, TransactionState
from txbroker.store.records import (
    JOB_ABORTED, JOB_COMMITTED, JOB_OPEN, PREPARED, JobDecisionRecord, JobState, ReleaseRecord,
)
from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)
_warnings = RepeatedWarnings(log)

UNKNOWN = "UNKNOWN"
ASK_BATCH = 5000  # member ids per QUERY_JOB_MEMBERS
ASK_ROUNDS = 3  # asks of the home in one pass, each about the members that joined during the one before
UNKNOWN_AT_HOME_LIMIT = 3  # answers "UNKNOWN" from the home before a member group parks the members
TICK_S = 1.0


class JobGroups:
    def __init__(self, state: StateMachine, jobs, transactions: TransactionService, cluster: ClusterMembership,
                 settings: SettingsBook, role: RoleState, observe_visible=lambda seconds: None):
        self._state = state
        self._jobs = jobs  # jobs.JobService: its published answers and the ending of members
        self._tx = transactions
        self._cluster = cluster
        self._settings = settings
        self._role = role
        self._observe = observe_visible  # decision to visible on every group (a metric)
        self._resolved_on: dict[str, set[str]] = {}  # at the home: job -> groups that said they resolved it
        self._unknown: dict[str, int] = {}  # at a member group: job -> UNKNOWN answers from its home
        self._following: dict[str, asyncio.Future] = {}  # asks in flight, one per job
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None and self._cluster.route is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="job groups")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        self._resolved_on.clear()
        self._unknown.clear()

    async def _run(self) -> None:
        while True:  # at least once a second: a group that was not told follows its home within that
            await asyncio.sleep(min(self._settings.tick_seconds(), TICK_S))
            try:
                await self.follow_homes()
                await self.release()
            except Exception:  # a failed pass must not end the asking for good
                log.exception("jobs spanning groups: pass failed; retrying at the next tick")

    # ---- the home's side: answering member groups ------------------------------------------------

    def members(self, req: JobMembersRequest) -> Reply:
        """QUERY_JOB_MEMBERS: how the decision treats these members of `req.group`, as published."""
        self._role.require_master()  # a slave's view lags its master's
        j = self._state.job(req.job_id)
        if j is None or j.producer_group != req.producer_group or j.home:
            return ok(JobMembersResponse(UNKNOWN, []))
        state = self._jobs.info(j).state
        if state != JOB_COMMITTED:
            return ok(JobMembersResponse(state, []))
        kept = set(j.remote.get(req.group, ()))
        return ok(JobMembersResponse(state, [t in kept for t in req.transaction_ids]))

    def settled(self) -> JobsSettledResponse:
        """QUERY_JOBS_SETTLED: the newest published decision of a job spanning groups decided here,
        and the decided ones not yet visible on every group (here included). A reader across groups
        whose end offsets lie between two equal answers with nothing unsettled sees each such job
        whole or not at all (spark reader.py)."""
        self._role.require_master()
        state = self._state
        durable = state.durable_lsn
        newest = state.newest_spanning_decision
        unsettled = ["(a decision not yet published)"] if newest > durable else []
        for job_id in sorted(state.unreleased_jobs()):
            j = state.job(job_id)
            if j is None or j.decision_lsn > durable:
                continue
            info = self._jobs.info(j)
            if not info.resolved:
                unsettled.append(job_id)
        return JobsSettledResponse(min(newest, durable), unsettled)

    def unresolved(self, j: JobState) -> list[str]:
        """At the home: the member groups not yet known to have resolved a decided job."""
        if j.released_lsn and j.released_lsn <= self._state.durable_lsn:
            return []
        done = self._resolved_on.get(j.job_id, set())
        return [g for g in j.groups if g not in done]

    async def release(self) -> int:
        """Ask the member groups of this home's decided, published jobs whether they resolved them;
        record a release for the jobs every group has. Returns how many were released."""
        if not self._role.is_master:
            return 0
        state, route = self._state, self._cluster.route
        released = []
        for job_id in list(state.unreleased_jobs()):
            j = state.job(job_id)
            if j is None or j.home or j.decision_lsn > state.durable_lsn:
                continue
            done = self._resolved_on.setdefault(job_id, set())
            for group in j.groups:
                if group in done:
                    continue
                if route is None or route.group(group) is None:  # the group left (drained): none waits there
                    done.add(group)
                    continue
                info = await self._ask_job(group, j)
                if info is not None and info.resolved:
                    done.add(group)
            if done >= set(j.groups):
                released.append(job_id)
                self._observe(max(now_ms() - j.decided_ms, 0) / 1000)
        if released and self._role.is_master:
            state.append(ReleaseRecord([], now_ms(), released))
            for job_id in released:
                self._resolved_on.pop(job_id, None)
        return len(released)

    async def _ask_job(self, group: str, j: JobState) -> JobInfo | None:
        client = self._cluster.peer(group)
        if client is None:
            return None
        try:
            return await client.request(RequestCode.QUERY_JOB, QueryJobRequest(j.producer_group, j.job_id), JobInfo)
        except BrokerError as e:
            if e.code == ResponseCode.QUERY_NOT_FOUND:  # never opened there: nothing of it to end
                return JobInfo(j.job_id, j.producer_group, j.state, j.open_ms, 0, resolved=True)
            _warnings.warning("job group refused", "job %s: group %s refused QUERY_JOB: %s", j.job_id, group, e)
        except ClientError as e:
            _warnings.warning("job group unreachable", "job %s: could not ask group %s whether it resolved it: %s",
                              j.job_id, group, e)
        return None

    # ---- a member group's side: following the home -------------------------------------------------

    async def follow_homes(self) -> int:
        """Ask the home of every undecided member-group entry; returns how many it decided now."""
        if not self._role.is_master:
            return 0
        decided = 0
        for j in [j for j in self._state.jobs.values() if j.home and not j.decided]:
            if await self._follow(j):
                decided += 1
        return decided

    def follow_now(self, j: JobState):
        """DECIDE_JOB sent to a member group: ask the home at once; answered as the entry then stands."""
        async def go() -> Reply:
            await self._follow(j)
            info = self._jobs.info(j)
            if info.state in (JOB_COMMITTED, JOB_ABORTED):
                return await self._jobs.answer_published(j)
            return error(ResponseCode.ILLEGAL_OPERATION, f"job {j.job_id} is decided by its home group {j.home}, where "
                                                         f"it is not decided yet (as published there): decide it there")
        return go()

    async def _follow(self, j: JobState) -> bool:
        """One ask of the home about `j` (one at a time per job); True if it decided `j` here."""
        running = self._following.get(j.job_id)
        if running is not None:
            await asyncio.shield(running)
            return False
        fut = self._following[j.job_id] = asyncio.get_running_loop().create_future()
        try:
            return await self._ask_home(j)
        finally:
            del self._following[j.job_id]
            fut.set_result(None)

    async def _ask_home(self, j: JobState) -> bool:
        client = self._cluster.peer(j.home)
        if client is None:
            _warnings.warning("job home not in route", "job %s: its home group %s is not in cluster route version %d",
                              j.job_id, j.home, self._cluster.route.version if self._cluster.route else 0)
            return False
        # The decision is recorded for the members pending when it is, so each of them must have been
        # asked about: one that joined while the home was asked (an answer can take seconds, the home
        # failing over) is asked about next, else a COMMIT would roll it back though the home keeps it.
        asked: set[str] = set()
        kept: list[str] = []
        state = None
        rounds = 0
        while True:
            members = sorted(set(self._state.job_members.get(j.job_id, ())) - asked)
            if state is not None and not members:
                break
            if rounds == ASK_ROUNDS:  # members still joining as fast as the home answers: ask again next time
                return False
            rounds += 1
            for i in range(0, max(len(members), 1), ASK_BATCH):
                batch = members[i:i + ASK_BATCH]
                try:
                    r: JobMembersResponse = await client.request(
                        RequestCode.QUERY_JOB_MEMBERS, JobMembersRequest(j.producer_group, j.job_id,
                                                                         self._cluster.group, batch),
                        JobMembersResponse)
                except ClientError as e:
                    _warnings.warning("job home unreachable", "job %s: could not ask its home group %s: %s",
                                      j.job_id, j.home, e)
                    return False
                if state is not None and r.state != state:  # decided between two batches: ask again next time
                    return False
                state = r.state
                asked.update(batch)
                kept += [t for t, keep in zip(batch, r.kept) if keep]
            if state != JOB_COMMITTED:  # only a COMMIT treats members apart: an ABORT ends all alike
                break
        if state == UNKNOWN:
            return self._unknown_at_home(j)
        self._unknown.pop(j.job_id, None)
        if state not in (JOB_COMMITTED, JOB_ABORTED):
            return False
        current = self._state.job(j.job_id)
        if current is None or current.decided or not self._role.is_master:
            return False
        commit = state == JOB_COMMITTED
        self._state.append(JobDecisionRecord(j.job_id, int(TransactionState.COMMIT if commit else TransactionState.ROLLBACK),
                                             now_ms(), kept if commit else [], "home"))
        self._jobs.decided(current, "home")
        return True

    def _unknown_at_home(self, j: JobState) -> bool:
        """The home does not know the job: its members here will never hear how it ended. After a few
        such answers they are parked (`tx list --state parked`, the parked-transactions alert)."""
        n = self._unknown[j.job_id] = self._unknown.get(j.job_id, 0) + 1
        if n < UNKNOWN_AT_HOME_LIMIT:
            return False
        now = now_ms()
        parked = [p for txid in sorted(self._state.job_members.get(j.job_id, ()))
                  if (p := self._state.pending_transaction(txid)) is not None and p.state == PREPARED]
        for p in parked:
            self._tx.park(p, now)
        if parked:
            log.warning("job %s: its home group %s does not know it (lost in a failover, or expired): its %d members "
                        "here are parked for an operator (`txbroker tx list --state parked`)", j.job_id, j.home,
                        len(parked))
        return False


__all__ = ["JobGroups", "JOB_OPEN"]
