"""The driver's side of a write: one coordinated transaction (a broker job) per Spark job, or per
micro-batch, opened by name, decided with one request, and waited on until it took effect. On a
TxBroker of several broker groups the job spans every active group, its decision at its home.

The decision lives in the broker's log (broker/transaction/jobs.py): no ledger file, no checker process, no
shared volume. A driver that dies before deciding leaves the job to the broker, which aborts it at
its deadline; one that dies after deciding leaves nothing to do: the broker ends the members.
"""

from __future__ import annotations

import logging
import time
import uuid

from txbroker.client import ClusterJob, ClusterJobCoordinator
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
    """A producer group's jobs on the cluster `brokers` belong to (or on a fixed `route`: the tasks of
    one write all use the route its driver saw), with the write's credentials and TLS. A job spans
    every active group; its decision is its home's (client/cluster/jobs.py)."""

    def __init__(self, brokers, group: str, security: BrokerSecurity | None = None, request_timeout: float = 30.0,
                 route=None, decision_timeout: float = 120.0):
        self.group = group
        self.security = security or BrokerSecurity()
        self._c = ClusterJobCoordinator(group, brokers, request_timeout=request_timeout, route=route,
                                        decision_timeout=decision_timeout, **self.security.client_kwargs())
        self._named(self._c.start)

    def _named(self, call):
        try:
            return call()
        except (BrokerError, TlsHandshakeError) as e:
            named = self.security.refusal(e)
            if named is not None:
                raise named from None
            if isinstance(e, BrokerError) and e.code == ResponseCode.TRANSACTION_STATE_GROUP_WRONG:
                raise OptionError("producerGroup", f"the broker refused: {e.remark} (a job name belongs to one "
                                                   "producer group: give this write another jobId)") from None
            raise

    @property
    def route(self):
        return self._c.route

    def open(self, name: str, timeout_seconds: float, prepared_timeout_seconds: float = 0) -> ClusterJob:
        """The newest job of `name` (on any group) unless it was aborted; else a new one, spanning
        every active group."""
        return self._named(lambda: self._c.open(timeout_seconds, name, prepared_timeout=prepared_timeout_seconds))

    def find(self, name: str) -> ClusterJob | None:
        return self._named(lambda: self._c.find(name))

    def describe(self, job: ClusterJob) -> JobInfo:
        return self._named(lambda: self._c.describe(job))

    def prepare(self, job: ClusterJob, members: dict[str, list[str]]) -> JobInfo:
        return self._named(lambda: self._c.prepare(job, members))

    def commit(self, job: ClusterJob, members: dict[str, list[str]] | None = None, decided=None) -> JobInfo:
        """The commit point. Raises JobAborted if the job was aborted first (its deadline passed).
        `decided()` runs once the home recorded the decision, before the other groups are told."""
        try:
            info = self._named(lambda: self._c.commit(job, members, tell=decided is None))
        except BrokerError as e:
            if e.code == ResponseCode.TRANSACTION_SHOULD_ROLLBACK:
                raise JobAborted(e.remark) from None
            raise
        if decided is not None:
            decided()
            self._named(lambda: self._c.tell(job))
        return info

    def abort(self, job: ClusterJob) -> JobInfo:
        """ABORT, unless already committed: then the commit stands (returned as is)."""
        try:
            return self._named(lambda: self._c.abort(job))
        except BrokerError as e:
            if e.code == ResponseCode.TRANSACTION_SHOULD_COMMIT:
                return self._c.describe(job)
            raise

    def wait_resolved(self, job: ClusterJob, timeout: float = 60.0) -> JobInfo:
        """Until every member on every group ended as decided and is published (consumers see them);
        the decision stands either way, so a timeout here only logs."""
        info = self._named(lambda: self._c.wait_resolved(job, timeout))
        if not info.resolved:
            log.warning("job %s: %s, %d members still being ended by the broker after %.0fs%s", job.job_id,
                        info.state, info.pending, timeout,
                        f" (groups not yet done: {', '.join(info.unresolved_groups)})" if info.unresolved_groups else "")
        return info

    def close(self) -> None:
        self._c.shutdown()

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
