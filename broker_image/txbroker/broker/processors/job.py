"""OPEN_JOB, PREPARE_JOB, DECIDE_JOB, QUERY_JOB: coordinated transactions (broker/transaction/jobs.py). Each
acts for a producer group, so each needs the right to it."""

from txbroker.broker.replies import Reply
from txbroker.protocol.bodies import DecideJobRequest, OpenJobRequest, PrepareJobRequest, QueryJobRequest, decoder


class JobProcessor:
    _REQUESTS = {"open": OpenJobRequest, "prepare": PrepareJobRequest, "decide": DecideJobRequest,
                 "query": QueryJobRequest}

    def __init__(self, broker, action: str):
        self._decode = decoder(self._REQUESTS[action]).decode
        self._call = getattr(broker.jobs, action)

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_producer_group(req.producer_group)
        return self._call(req)
