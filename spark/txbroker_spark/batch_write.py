"""A batch write (`df.write.format("txbroker")...save()`), Spark's BatchWrite: one broker job per write.

  driver, planning   checks the options (fails fast naming the option), probes the brokers, opens the
                     job by name (option jobId, else a new name) with the deadline deadlineSeconds;
                     the broker's answer to OPEN_JOB is also the check that the credentials may act
                     for the producer group.
  each task attempt  sends its rows as half messages joining the job, `batchSize` rows per
                     transaction, with ids `<job>-p<partition>-t<task attempt id>-c<n>` (unique to the
                     attempt); returns the ids in its commit message (data_writer.py).
  driver, commit()   one DECIDE_JOB: COMMIT with exactly the ids of the attempts Spark kept (commit.py).
                     The broker ends every member itself: the kept ones become visible, the
                     transactions of attempts Spark discarded (failed, retried, speculative losers,
                     lost executors) are rolled back. commit=deferred records the member list instead
                     (PREPARE_JOB) and leaves the decision to the application (deferred.py).
  driver, abort()    ABORT: the broker rolls back every member.
  driver lost        before its decision, the broker aborts the job at its deadline; after it, the
                     broker has already everything it needs.
"""

from __future__ import annotations

import time

from pyspark.sql.datasource import DataSourceArrowWriter

from txbroker_spark.commit import Kept, abort_job, decide_commit, jobs_for
from txbroker_spark.data_writer import DataWriter, TaskAttempt, TxCommitMessage
from txbroker_spark.jobs import OPEN, check_name, new_job_id
from txbroker_spark.logs import log, setup_logging
from txbroker_spark.options import P_JOB, P_KIND, OptionError, WriteOptions
from txbroker_spark.probe import probe_brokers


class TxBrokerBatchWriter(DataSourceArrowWriter):
    def __init__(self, o: WriteOptions):
        setup_logging()
        self.o = o
        probe_brokers(o.brokers, o.topic, security=o.security)
        self.name = check_name("jobId", o.job_id or new_job_id())
        with jobs_for(o) as jobs:
            info = jobs.open(self.name, o.deadline_ms / 1000)
        if info.state != OPEN:
            raise OptionError("jobId", f"job {self.name} is already {info.state} on the broker (job id "
                                       f"{info.job_id}); use a new id")
        self.job = info.job_id
        log.info("job %s: publishing to %s as group %s (broker job %s, deadline in %.0fs; %s)", self.name, o.topic,
                 o.group, self.job, (info.deadline_ms - time.time() * 1000) / 1000, o.security.describe())

    def write(self, iterator) -> TxCommitMessage:
        setup_logging()
        job, attempt = self.job, TaskAttempt.current()
        prefix = f"{job}-p{attempt.partition}-t{attempt.task_attempt_id}"
        writer = DataWriter(self.o, job, attempt, {P_KIND: "batch", P_JOB: job}, lambda n, msgs: f"{prefix}-c{n}",
                            f"job {job}")
        return writer.run(lambda w: w.write_arrow(iterator))

    def commit(self, messages) -> None:
        setup_logging()
        o, kept = self.o, Kept.of(messages)
        with jobs_for(o) as jobs:
            if o.commit == "deferred":
                jobs.prepare(self.job, kept.txids)
                log.info("job %s: %d rows in %d half transactions prepared; the application decides (deferred "
                         "commit)", self.name, kept.rows, len(kept.txids))
                return
            decide_commit(o, jobs, self.job, f"job {self.name}", kept)

    def abort(self, messages) -> None:
        setup_logging()
        with jobs_for(self.o) as jobs:
            abort_job(jobs, self.job, f"job {self.name}")
