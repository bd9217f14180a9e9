"""The driver's side of a write: one coordinated transaction (a broker job) per Spark job, or per
micro-batch, opened by name, decided with one request, and waited on until it took effect.

The decision lives in the broker's log (broker/transaction/jobs.py): no ledger file, no checker process, no
shared volume. A driver that dies before deciding leaves the job to the broker, which aborts it at
its deadline; one that dies after deciding leaves nothing to do: the broker ends the members.
"""

from __future__ import annotations

import logging
import time
import uuid

from txbroker.client import JobCoordinator
from txbroker.client.errors import BrokerError, TlsHandshakeError
from txbroker.protocol.bodies import (  # noqa: F401 - the job states as the broker says them, re-exported
    JOB_ABORTED as ABORTED, JOB_COMMITTED as COMMITTED, JOB_OPEN as OPEN, JOB_PREPARED as PREPARED, JobInfo,
)
from txbroker.protocol.codes import ResponseCode
from txbroker.protocol.names import JOB_NAME, JOB_NAME_RULE

from txbroker_spark.options import OptionError
from txbroker_spark.security import BrokerSecurity

log = logging.getLogger("txbroker_spark")


class JobAborted(RuntimeError):
    """The job was aborted (by the broker at its deadline, or by someone else) before this commit."""


class Jobs:
    """A producer group's jobs on the brokers, with the write's credentials and TLS."""

    def __init__(self, brokers, group: str, security: BrokerSecurity | None = None, request_timeout: float = 30.0):
        self.group = group
        self.security = security or BrokerSecurity()
        self._c = JobCoordinator(group, brokers, request_timeout=request_timeout, **self.security.client_kwargs())

    def _named(self, call):
        try:
            return call()
        except (BrokerError, TlsHandshakeError) as e:
            named = self.security.refusal(e)
            if named is not None:
                raise named from None
            raise

    def open(self, name: str, timeout_seconds: float) -> JobInfo:
        """The newest job of `name` unless it was aborted; else a new one."""
        return self._named(lambda: self._c.open(timeout_seconds, name))

    def find(self, name: str) -> JobInfo | None:
        try:
            return self._named(lambda: self._c.describe(name=name))
        except BrokerError as e:
            if e.code == ResponseCode.QUERY_NOT_FOUND:
                return None
            raise

    def describe(self, job_id: str) -> JobInfo:
        return self._named(lambda: self._c.describe(job_id))

    def prepare(self, job_id: str, members: list[str]) -> JobInfo:
        return self._named(lambda: self._c.prepare(job_id, members))

    def commit(self, job_id: str, members: list[str] | None = None) -> JobInfo:
        """The commit point. Raises JobAborted if the job was aborted first (its deadline passed)."""
        try:
            return self._named(lambda: self._c.commit(job_id, members))
        except BrokerError as e:
            if e.code == ResponseCode.TRANSACTION_SHOULD_ROLLBACK:
                raise JobAborted(e.remark) from None
            raise

    def abort(self, job_id: str) -> JobInfo:
        """ABORT, unless already committed: then the commit stands (returned as is)."""
        try:
            return self._named(lambda: self._c.abort(job_id))
        except BrokerError as e:
            if e.code == ResponseCode.TRANSACTION_SHOULD_COMMIT:
                return self._c.describe(job_id)
            raise

    def wait_resolved(self, job_id: str, timeout: float = 60.0) -> JobInfo:
        """Until every member ended as decided and is published (consumers see them); the decision
        stands either way, so a timeout here only logs."""
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            info = self.describe(job_id)
            if info.resolved or time.monotonic() >= deadline:
                if not info.resolved:
                    log.warning("job %s: %s, %d members still being ended by the broker after %.0fs", job_id,
                                info.state, info.pending, timeout)
                return info
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def close(self) -> None:
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def new_job_id(prefix: str = "j") -> str:
    """A new job name, `<prefix><local time YYYYmmddTHHMMSS>-<8 hex>`: a batch write's unless option jobId names it."""
    return f"{prefix}{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def check_name(option: str, name: str) -> str:
    if not JOB_NAME.fullmatch(name):
        raise OptionError(option, f"{name!r} cannot name a broker job: {JOB_NAME_RULE}")
    return name
