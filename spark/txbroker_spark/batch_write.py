"""A batch write (`df.write.format("txbroker")...save()`), Spark's BatchWrite: one broker job per write,
spanning every active broker group of the TxBroker.

  driver, planning   checks the options (fails fast naming the option), probes the brokers, learns
                     the cluster's route (cluster.py: the groups, the topic's queues on each), opens
                     the job by name (option jobId, else a new name) with the deadline
                     deadlineSeconds: at its home group, with an entry on every other active group.
                     A job of that name an earlier run left OPEN (its driver died) is joined: its
                     members are not this run's and are rolled back by the decision; one it left
                     PREPARED is aborted and a new one opened; a COMMITTED one is refused.
  each task attempt  places its rows on the groups (by keyColumn: one key, one queue; else evenly),
                     `batchSize` rows per transaction, with ids `<job>-r<run>-p<partition>-t<task
                     attempt id>-<group>-c<n>`: unique to this run (a re-run's attempts start their
                     ids again, and must never take a dead run's members for their own) and to the
                     attempt; returns the ids, by group, in its commit message (data_writer.py).
  driver, commit()   one DECIDE_JOB at the home: COMMIT with exactly the ids of the attempts Spark kept,
                     by group (commit.py); every group ends its members as the home decided: the kept
                     ones become visible, every other member (discarded attempts, a dead run's) is
                     rolled back. commit=deferred records the member lists instead (PREPARE_JOB) and
                     leaves the decision to the application (deferred.py).
  driver, abort()    ABORT: every group rolls back every member.
  driver lost        before its decision, the home aborts the job at its deadline (every group follows);
                     after it, the brokers have everything they need.
"""

from __future__ import annotations

import time
import uuid

from pyspark.sql.datasource import DataSourceArrowWriter

from txbroker_spark.cluster import WriteRoute, learn_route
from txbroker_spark.commit import Kept, abort_job, decide_commit, jobs_for
from txbroker_spark.data_writer import DataWriter, TaskAttempt, TxCommitMessage
from txbroker_spark.jobs import COMMITTED, OPEN, PREPARED, check_name, new_job_id
from txbroker_spark.logs import log, setup_logging
from txbroker_spark.options import P_JOB, P_KIND, OptionError, WriteOptions
from txbroker_spark.probe import probe_brokers


class TxBrokerBatchWriter(DataSourceArrowWriter):
    def __init__(self, o: WriteOptions):
        setup_logging()
        self.o = o
        probe_brokers(o.brokers, o.topic, security=o.security)
        self.name = check_name("jobId", o.job_id or new_job_id())
        self.run = uuid.uuid4().hex[:8]  # this run of the application: its members' ids are its own
        route = learn_route(o.brokers, o.topic, o.security, o.request_timeout)
        o.faults.at_point("before-open", None, {"job": self.name})
        with jobs_for(o) as jobs:
            job = jobs.open(self.name, o.deadline_ms / 1000, o.prepared_deadline_ms / 1000)
            if job.info.state == PREPARED or (job.info.state == OPEN and job.info.already):
                # An earlier run's job (its driver died, or it still runs): abort it and open this
                # run's own, with this run's deadline (joined, it kept the earlier run's, and could
                # abort in the middle of this write), as a Kafka producer fences an older one with
                # its transactional.id; the earlier run's members roll back now.
                log.warning("job %s: an earlier run's job %s is still %s (its driver died?); aborting it: this "
                            "run opens its own job and publishes only its own rows", self.name, job.job_id,
                            job.info.state)
                jobs.abort(job)
                job = jobs.open(self.name, o.deadline_ms / 1000, o.prepared_deadline_ms / 1000)
        if job.info.state == COMMITTED:
            raise OptionError("jobId", f"job {self.name} is already COMMITTED on the broker (job id {job.job_id}): "
                                       "its rows were published; use a new id to publish again")
        if job.info.state != OPEN:
            raise OptionError("jobId", f"job {self.name} is already {job.info.state} on the broker (job id "
                                       f"{job.job_id}); use a new id")
        self.job = job
        self.route: WriteRoute = route.only(job.all_groups)
        missing = set(job.all_groups) - set(self.route.names)
        if missing:
            raise OptionError("brokers", f"job {self.name} spans groups {', '.join(sorted(missing))} that the "
                                         f"cluster route no longer lists as active")
        log.info("job %s: publishing to %s as group %s on %s (broker job %s at home %s, deadline in %.0fs; %s)",
                 self.name, o.topic, o.group, ", ".join(self.route.names), job.job_id, job.home,
                 (job.info.deadline_ms - time.time() * 1000) / 1000, o.security.describe())

    def write(self, iterator) -> TxCommitMessage:
        setup_logging()
        job, attempt = self.job.job_id, TaskAttempt.current()
        prefix = f"{job}-r{self.run}-p{attempt.partition}-t{attempt.task_attempt_id}"
        writer = DataWriter(self.o, job, attempt, {P_KIND: "batch", P_JOB: job},
                            lambda group, n, msgs: f"{prefix}-{group}-c{n}", f"job {job}", self.route)
        return writer.run(lambda w: w.write_arrow(iterator))

    def commit(self, messages) -> None:
        setup_logging()
        o, kept = self.o, Kept.of(messages)
        with jobs_for(o) as jobs:
            if o.commit == "deferred":
                jobs.prepare(self.job, kept.members)
                log.info("job %s: %d rows in %d half transactions prepared; the application decides (deferred "
                         "commit)", self.name, kept.rows, kept.count)
                return
            decide_commit(o, jobs, self.job, f"job {self.name}", kept)

    def abort(self, messages) -> None:
        setup_logging()
        with jobs_for(self.o) as jobs:
            abort_job(jobs, self.job, f"job {self.name}")
