"""The driver's decision on a write's job, one sequence for batch and streaming writes: gather what
the task attempts Spark kept stored, decide (one DECIDE_JOB: COMMIT exactly those members, every
other member rolls back), then wait until the broker has ended the members (the kept ones are
visible). Or abort: the broker rolls back every member, unless the job was already committed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from txbroker.client import ClusterJob, DecisionNotReplicated

from txbroker_spark.jobs import COMMITTED, JobAborted, Jobs
from txbroker_spark.logs import log
from txbroker_spark.options import WriteOptions


def jobs_for(o: WriteOptions, route=None) -> Jobs:
    """The write's producer group's jobs, with its credentials and TLS (on `route`, a ClusterRoute the
    driver took, if given)."""
    return Jobs(o.brokers, o.group, o.security, o.request_timeout, route, o.decision_timeout)


@dataclass
class Kept:
    """What the task attempts Spark kept stored (from their commit messages): members by group."""

    members: dict[str, list[str]]
    rows: int
    duplicates: int
    jobs: set[str]  # the jobs their transactions joined

    @classmethod
    def of(cls, messages) -> "Kept":
        msgs = [m for m in messages if m is not None]
        members: dict[str, list[str]] = {}
        for m in msgs:
            for group, ids in m.txids.items():
                members.setdefault(group, []).extend(ids)
        return cls(members, sum(m.rows for m in msgs), sum(m.duplicates for m in msgs),
                   {m.job for m in msgs if any(m.txids.values())})

    @property
    def count(self) -> int:
        return sum(len(ids) for ids in self.members.values())


def decide_commit(o: WriteOptions, jobs: Jobs, job: ClusterJob, what: str, kept: Kept,
                  batch_id: int | None = None) -> None:
    """The commit point (one request, at the job's home), then wait until every group made the
    members visible. A job the broker aborted first (its deadline passed) raises: nothing of it was
    published."""
    detail = {"job": job.job_id, "txids": kept.count}
    o.faults.at_point("before-decision", batch_id, detail)
    t0 = time.monotonic()
    try:
        jobs.commit(job, kept.members, decided=lambda: o.faults.at_point("after-home-decision", batch_id, detail))
    except JobAborted as e:
        raise RuntimeError(f"txbroker: {what}: the broker refused the commit ({e}); nothing of it was "
                           "published") from None
    except DecisionNotReplicated as e:  # neither refused nor promised: say so, never "nothing published"
        raise RuntimeError(f"txbroker: {what}: the outcome of job {job.job_id} is unknown: {e}") from None
    o.faults.at_point("after-decision", batch_id, detail)
    info = jobs.wait_resolved(job, o.request_timeout)
    log.info("%s: committed %d rows in %d transactions on %s (job %s; decision and visibility %.3fs)", what,
             kept.rows, kept.count, ", ".join(f"{g}: {len(ids)}" for g, ids in sorted(kept.members.items())),
             job.job_id, time.monotonic() - t0)
    if not info.resolved:
        log.warning("%s: the decision is recorded; the broker is still ending %d members", what, info.pending)


def abort_job(jobs: Jobs, job: ClusterJob, what: str, then: str = "") -> None:
    """ABORT; a job already committed (a commit that failed after its decision) keeps its decision."""
    info = jobs.abort(job)
    if info.state == COMMITTED:
        log.error("%s: abort after the COMMIT decision; the decision stands", what)
        return
    log.warning("%s aborted (job %s): the broker rolls back its %d stored half transactions%s", what, job.job_id,
                info.pending, then)
