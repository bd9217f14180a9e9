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
the other way, or aborted at its deadline) raises BrokerError naming the decision.
"""

from __future__ import annotations


from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.client.producer import as_list
from txbroker.client.transaction_session import TransactionSession
from txbroker.protocol.bodies import DecideJobRequest, JobInfo, OpenJobRequest, PrepareJobRequest, QueryJobRequest
from txbroker.protocol.codes import RequestCode, TransactionState

__all__ = ["AsyncJobCoordinator", "JobCoordinator", "JobInfo"]


class AsyncJobCoordinator:
    def __init__(self, group: str, brokers, *, request_timeout: float = 30.0, credentials=None, tls=None):
        if not group:
            raise ValueError("a job needs a producer group")
        self.group = group
        self.client = BrokerClient(brokers, request_timeout=request_timeout, credentials=credentials, tls=tls)
        self.session = TransactionSession(self.client, group)  # the members' half messages and their ends

    async def open(self, timeout: float, name: str = "") -> JobInfo:
        """A job the broker aborts unless decided within `timeout` seconds. With `name`: the newest
        job of that name if it is not aborted (its state says whether it was already committed)."""
        return await self._call(RequestCode.OPEN_JOB, OpenJobRequest(self.group, int(timeout * 1000), name))

    async def send(self, job_id: str, msg_or_msgs, transaction_id: str | None = None) -> str:
        """Store messages as one half message joining the job; returns its transaction id."""
        return (await self.session.prepare(as_list(msg_or_msgs), transaction_id, job_id)).transaction_id

    async def prepare(self, job_id: str, members: list[str]) -> JobInfo:
        """Fix the member list (no new members); `commit(job_id)` then keeps exactly these."""
        return await self._call(RequestCode.PREPARE_JOB, PrepareJobRequest(self.group, job_id, list(members)))

    async def commit(self, job_id: str, members: list[str] | None = None) -> JobInfo:
        """COMMIT keeping exactly `members` (None: the prepared list); every other member rolls back."""
        return await self._call(RequestCode.DECIDE_JOB, DecideJobRequest(
            self.group, job_id, int(TransactionState.COMMIT), None if members is None else list(members)))

    async def abort(self, job_id: str) -> JobInfo:
        return await self._call(RequestCode.DECIDE_JOB, DecideJobRequest(self.group, job_id,
                                                                         int(TransactionState.ROLLBACK)))

    async def describe(self, job_id: str = "", name: str = "") -> JobInfo:
        return await self._call(RequestCode.QUERY_JOB, QueryJobRequest(self.group, job_id, name))

    async def _call(self, code: RequestCode, body) -> JobInfo:
        return await self.client.request(code, body, JobInfo, retry=True)

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

    def open(self, timeout: float, name: str = "") -> JobInfo:
        return background.run(self.aio.open(timeout, name))

    def send(self, job_id: str, msg_or_msgs, transaction_id: str | None = None) -> str:
        return background.run(self.aio.send(job_id, msg_or_msgs, transaction_id))

    def prepare(self, job_id: str, members: list[str]) -> JobInfo:
        return background.run(self.aio.prepare(job_id, members))

    def commit(self, job_id: str, members: list[str] | None = None) -> JobInfo:
        return background.run(self.aio.commit(job_id, members))

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
