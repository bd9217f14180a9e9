"""OPEN_JOB, PREPARE_JOB, DECIDE_JOB, QUERY_JOB: coordinated transactions (broker/transaction/jobs.py);
QUERY_JOB_MEMBERS: a group holding members of a job that spans groups asks its home
(broker/transaction/job_groups.py). Each acts for a producer group, so each needs the right to it; the
questions one group's broker asks another's may come with the replication right instead."""

from txbroker.broker.replies import Reply, RequestError, ok
from txbroker.protocol.bodies import (
    DecideJobRequest, JobMembersRequest, JobsSettledRequest, OpenJobRequest, PrepareJobRequest, QueryJobRequest,
    decoder,
)


def require_group_or_peer(conn, producer_group: str) -> None:
    """Another group's broker (its replication credentials), or the producer group's own clients."""
    try:
        conn.access.require_replication()
    except RequestError:
        conn.access.require_producer_group(producer_group)


class JobProcessor:
    _REQUESTS = {"open": OpenJobRequest, "prepare": PrepareJobRequest, "decide": DecideJobRequest,
                 "query": QueryJobRequest}

    def __init__(self, broker, action: str):
        self._decode = decoder(self._REQUESTS[action]).decode
        self._call = getattr(broker.jobs, action)
        self._peers_too = action == "query"  # a home asks a member group whether it resolved a job
        self._role = broker.role

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        if self._peers_too:
            require_group_or_peer(conn, req.producer_group)
            self._role.require_current()  # (the others need the master: jobs.py)
        else:
            conn.access.require_producer_group(req.producer_group)
        return self._call(req)


class JobMembersProcessor:
    def __init__(self, broker):
        self._decode = decoder(JobMembersRequest).decode
        self._groups = broker.job_groups

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        require_group_or_peer(conn, req.producer_group)
        return self._groups.members(req)


class JobsSettledProcessor:
    """Job ids and an LSN only (no message data): any client that may connect may ask."""

    def __init__(self, broker):
        self._decode = decoder(JobsSettledRequest).decode
        self._groups = broker.job_groups

    def __call__(self, conn, body: bytes) -> Reply:
        self._decode(body)
        return ok(self._groups.settled())
