"""Coordinated transactions ("jobs"): open one, send member transactions into it from anywhere,
and decide it with one request; the broker ends every member itself (broker/transaction/jobs.py).

    from txbroker.client import JobCoordinator, Message

    with JobCoordinator("orders-publisher", "127.0.0.1:10911") as c:
        job = c.open(timeout=600)                                   # JobInfo; job.job_id
        t1 = c.send(job.job_id, [Message("Orders", b"o1")])         # a member (from any process)
        t2 = c.send(job.job_id, [Message("Billing", b"b1")])
        c.commit(job.job_id, [t1, t2])                              # the commit point; or c.abort(job.job_id)

Every call is safe to repeat (ids make them idempotent), so each is retried on the master across
reconnects and failovers until the request timeout. A refused decision (the job was already decided
the other way, or aborted at its deadline) raises BrokerError naming the decision. A decision the
master stored but its slaves do not hold yet is asked again until they do; past `decision_timeout`
(the request timeout unless given: a failover's heir may wait for its old master to rejoin as its
slave) it raises DecisionNotReplicated (its outcome unknown), never a BrokerError.
"""

from __future__ import annotations

import asyncio
import time

from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import BrokerError, DecisionNotReplicated
from txbroker.client.producer import as_list
from txbroker.client.transaction_session import TransactionSession
from txbroker.protocol.bodies import DecideJobRequest, JobInfo, OpenJobRequest, PrepareJobRequest, QueryJobRequest
from txbroker.protocol.codes import RequestCode, ResponseCode, TransactionState

__all__ = ["AsyncJobCoordinator", "JobCoordinator", "JobInfo"]

# SYNC replication's answers to a write the master stored and its slaves do not hold yet: not a
# refusal. A repeated decision is answered when they have it (or decides afresh on a master that
# never had it), so the coordinator asks again instead of reporting the first answer.
NOT_REPLICATED = (ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE)


class AsyncJobCoordinator:
    def __init__(self, group: str, brokers, *, request_timeout: float = 30.0, decision_timeout: float | None = None,
                 credentials=None, tls=None):
        if not group:
            raise ValueError("a job needs a producer group")
        self.group = group
        self.decision_timeout = request_timeout if decision_timeout is None else decision_timeout
        self.client = BrokerClient(brokers, request_timeout=request_timeout, credentials=credentials, tls=tls)
        self.session = TransactionSession(self.client, group)  # the members' half messages and their ends

    async def open(self, timeout: float, name: str = "", *, prepared_timeout: float = 0, groups=(),
                   home: str = "", job_id: str = "") -> JobInfo:
        """A job the broker aborts unless decided within `timeout` seconds (once PREPARED, within
        `prepared_timeout`: 24 h if 0). With `name`: the newest job of that name if it is not
        aborted (its state says whether it was already committed). A job spanning broker groups is
        opened at its home naming the other `groups`, then on each of them with `home` and the
        home's `job_id` (client/cluster/jobs.py does both)."""
        return await self._call(RequestCode.OPEN_JOB, OpenJobRequest(
            self.group, int(timeout * 1000), name, list(groups), job_id, home, int(prepared_timeout * 1000)))

    async def send(self, job_id: str, msg_or_msgs, transaction_id: str | None = None,
                   properties: dict[str, str] | None = None) -> str:
        """Store messages as one half message joining the job; returns its transaction id.
        `properties`: every message carries them (under its own), sent once for all."""
        return (await self.session.prepare(as_list(msg_or_msgs), transaction_id, job_id,
                                           properties=properties)).transaction_id

    async def prepare(self, job_id: str, members: list[str], remote: dict[str, list[str]] | None = None) -> JobInfo:
        """Fix the member list (no new members); `commit(job_id)` then keeps exactly these (`remote`:
        a job spanning groups, its members on each other group)."""
        return await self._decide(RequestCode.PREPARE_JOB, PrepareJobRequest(self.group, job_id, list(members),
                                                                             dict(remote or {})))

    async def commit(self, job_id: str, members: list[str] | None = None,
                     remote: dict[str, list[str]] | None = None) -> JobInfo:
        """COMMIT keeping exactly `members` (None: the prepared list; `remote`: those kept on each
        other group of a job spanning groups); every other member rolls back."""
        return await self._decide(RequestCode.DECIDE_JOB, DecideJobRequest(
            self.group, job_id, int(TransactionState.COMMIT), None if members is None else list(members),
            None if remote is None else dict(remote)))

    async def abort(self, job_id: str) -> JobInfo:
        return await self._decide(RequestCode.DECIDE_JOB, DecideJobRequest(self.group, job_id,
                                                                           int(TransactionState.ROLLBACK)))

    async def describe(self, job_id: str = "", name: str = "") -> JobInfo:
        return await self._call(RequestCode.QUERY_JOB, QueryJobRequest(self.group, job_id, name))

    async def _call(self, code: RequestCode, body, timeout: float | None = None) -> JobInfo:
        return await self.client.request(code, body, JobInfo, retry=True, timeout=timeout)

    async def _decide(self, code: RequestCode, body) -> JobInfo:
        """A decision (or prepare), asked again while the master answers it stored but unreplicated."""
        deadline = time.monotonic() + self.decision_timeout
        delay = 0.05
        while True:
            try:
                return await self._call(code, body, max(deadline - time.monotonic(), 0.01))
            except BrokerError as e:
                if e.code not in NOT_REPLICATED:
                    raise
                if time.monotonic() + delay >= deadline:
                    raise DecisionNotReplicated(
                        f"{RequestCode(code).name} of job {body.job_id}: stored on the master, not acknowledged by "
                        f"its slaves within {self.decision_timeout:g}s ({e.remark}); it takes effect once "
                        "they have it and is lost if a failover takes it away: describe the job to learn which"
                    ) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class JobCoordinator:
    """Blocking form of AsyncJobCoordinator."""

    def __init__(self, group: str, brokers, **kwargs):
        self.aio = AsyncJobCoordinator(group, brokers, **kwargs)

    def open(self, timeout: float, name: str = "", **kwargs) -> JobInfo:
        return background.run(self.aio.open(timeout, name, **kwargs))

    def send(self, job_id: str, msg_or_msgs, transaction_id: str | None = None,
             properties: dict[str, str] | None = None) -> str:
        return background.run(self.aio.send(job_id, msg_or_msgs, transaction_id, properties))

    def prepare(self, job_id: str, members: list[str], remote: dict[str, list[str]] | None = None) -> JobInfo:
        return background.run(self.aio.prepare(job_id, members, remote))

    def commit(self, job_id: str, members: list[str] | None = None,
               remote: dict[str, list[str]] | None = None) -> JobInfo:
        return background.run(self.aio.commit(job_id, members, remote))

    def abort(self, job_id: str) -> JobInfo:
        return background.run(self.aio.abort(job_id))

    def describe(self, job_id: str = "", name: str = "") -> JobInfo:
        return background.run(self.aio.describe(job_id, name))

    def close(self) -> None:
        background.run(self.aio.close())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
