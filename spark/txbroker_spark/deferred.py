"""Deferred commit: the application runs its own local transaction between the half messages and
the decision (RocketMQ's pattern with Spark in the middle).

    name = new_job_id("orders-")
    events.write.format("txbroker").option("commit", "deferred").option("jobId", name)...save()
    d = DeferredJob(brokers, group, name)    # the half messages are stored, invisible, the member list
                                             # fixed on the broker (PREPARE_JOB)
                                             # (a secured broker: security=parse_security(options))
    ... the local transaction (e.g. write a dataset) ...
    d.commit()                               # the commit point: one DECIDE_JOB; the broker makes the
                                             # events visible (d.abort() rolls them back)
    ... make the local transaction's result visible (idempotent, may be redone after a crash) ...

If the application dies before `commit`, the broker aborts the job at its deadline; after
`commit`, the broker publishes the events anyway. A rerun asks `state()` to finish or undo its
local side.
"""

from __future__ import annotations

from dataclasses import dataclass

from txbroker.protocol.bodies import JobInfo

from txbroker_spark.jobs import ABORTED, COMMITTED, OPEN, JobAborted, Jobs
from txbroker_spark.security import BrokerSecurity

__all__ = ["DeferredJob", "JobAborted"]


@dataclass
class DeferredJob:
    brokers: str | list[str]
    group: str
    name: str  # the write's option jobId
    request_timeout: float = 30.0
    security: BrokerSecurity | None = None  # credentials and TLS, as the write's (None: none)
    decision_timeout: float = 120.0  # as the write's option decisionTimeoutSeconds

    def __post_init__(self):
        self.jobs = Jobs(self.brokers, self.group, self.security, self.request_timeout,
                         decision_timeout=self.decision_timeout)

    def _job(self):
        return self.jobs.find(self.name)

    def info(self) -> JobInfo | None:
        """The job as the broker holds it, at its home (None: never opened)."""
        job = self._job()
        return None if job is None else job.info

    def _prepared(self):
        job = self._job()
        if job is None or job.info.state == OPEN:
            raise RuntimeError(f"job {self.name} has no prepared member list on the broker: its write did not finish "
                               "(or did not use commit=deferred)")
        return job

    def prepared(self) -> JobInfo:
        return self._prepared().info

    def commit(self) -> JobInfo:
        """The commit point: COMMIT the prepared members (on every group). Raises JobAborted if the job
        was aborted first (its deadline or prepared bound passed, or a rerun took it over)."""
        job = self._prepared()
        if job.info.state == ABORTED:
            raise JobAborted(f"job {self.name} ({job.job_id}) was ABORTED by {job.info.by or 'client'}")
        return self.jobs.commit(job)

    def abort(self) -> JobInfo | None:
        """ABORT (the broker rolls back every member), unless already committed. None: never opened."""
        job = self._job()
        if job is None or job.info.state in (ABORTED, COMMITTED):
            return None if job is None else job.info
        return self.jobs.abort(job)

    def wait_visible(self, timeout: float = 60.0) -> JobInfo:
        return self.jobs.wait_resolved(self._prepared(), timeout)

    def state(self) -> str:
        """The job's state for a rerun: COMMITTED (finish the local side), ABORTED (or never opened:
        undo it), OPEN or PREPARED (undecided: another run may still be at work; the broker aborts
        it at its deadline if its driver is gone)."""
        info = self.info()
        return ABORTED if info is None else info.state

    def close(self) -> None:
        self.jobs.close()
