"""A streaming write (`writeStream.format("txbroker")`), Spark's StreamingWrite: one broker job per
micro-batch, named `<query>.b<batch>`, which the tasks open (the first one creates it, the others
find it).

Each micro-batch's job spans every active broker group (its home: the group its name hashes to on
the route the query's driver saw); rows are placed as a batch write places them (cluster.py).
Transaction ids are `<job id>-p<partition>-<group>-c<n>-<content hash>`: a batch replayed after a restart
into the same open job sends the same ids, which the broker recognises as duplicates; a batch whose
job was already committed sends nothing and its commit is a no-op; after an abort (or the deadline)
the replay opens a new job, so rolled-back ids are never reused. The decision is the batch write's
(commit.py).
"""

from __future__ import annotations

import itertools
import json
import os
from urllib.parse import urlparse

from pyspark.sql.datasource import DataSourceStreamWriter

from txbroker_spark.cluster import WriteRoute, learn_route
from txbroker_spark.commit import Kept, abort_job, decide_commit, jobs_for
from txbroker_spark.data_writer import DataWriter, TaskAttempt, TxCommitMessage
from txbroker_spark.jobs import ABORTED, COMMITTED, OPEN
from txbroker_spark.logs import log, setup_logging
from txbroker_spark.messages import content_hash
from txbroker_spark.options import P_BATCH, P_JOB, P_KIND, P_QUERY, OptionError, WriteOptions
from txbroker_spark.probe import probe_brokers


def stream_identity(o: WriteOptions) -> str:
    """The query's stable identity: option streamId, or the id in its checkpoint's metadata."""
    if o.stream_id:
        return o.stream_id
    if not o.checkpoint:
        raise OptionError("checkpointLocation", "is required for a txbroker streaming sink (it names the query "
                                                "across restarts); or set option streamId")
    url = urlparse(o.checkpoint)
    if url.scheme not in ("", "file"):
        raise OptionError("streamId", f"the checkpoint {o.checkpoint} is not on a local filesystem; set streamId to a "
                                      "name unique to this query")
    path = os.path.join(url.path if url.scheme else o.checkpoint, "metadata")
    try:
        with open(path) as f:
            return str(json.loads(f.readline())["id"])
    except (OSError, ValueError, KeyError) as e:
        raise OptionError("checkpointLocation", f"cannot read the query id from {path}: {e}") from None


class TxBrokerStreamWriter(DataSourceStreamWriter):
    def __init__(self, o: WriteOptions):
        setup_logging()
        self.o = o
        self.query = stream_identity(o)
        # The driver opens no job here (the tasks of each micro-batch do): the group right is checked now.
        probe_brokers(o.brokers, o.topic, security=o.security, group=o.group)
        # Every task of every micro-batch places by this route, so each batch's job has one home
        # whichever task opens it first (a route change takes effect when the query restarts).
        self.route: WriteRoute = learn_route(o.brokers, o.topic, o.security, o.request_timeout)

    def _name(self, batch_id: int) -> str:
        return f"{self.query}.b{batch_id}"

    def _jobs(self):
        return jobs_for(self.o, self.route.route())

    def write(self, iterator) -> TxCommitMessage:
        setup_logging()
        o, query, attempt = self.o, self.query, TaskAttempt.current()
        batch_id, part = attempt.batch_id, attempt.partition
        if batch_id < 0:
            raise RuntimeError("txbroker: streaming write outside a micro-batch (no batch id)")
        first = next(iterator, None)
        if first is None:  # nothing in this partition: no job needed
            return attempt.empty_commit("", query)
        with self._jobs() as jobs:
            cluster_job = jobs.open(self._name(batch_id), o.deadline_ms / 1000)
        job, info = cluster_job.job_id, cluster_job.info
        if info.state == COMMITTED:  # a replay of a batch whose decision was COMMIT: already published
            log.info("query %s batch %d partition %d: job %s already committed; sending nothing", query, batch_id,
                     part, job)
            return attempt.empty_commit(job, query)
        if info.state != OPEN:
            raise RuntimeError(f"txbroker: query {query} batch {batch_id}: job {job} is {info.state}; it takes no "
                               "new members")
        prefix = f"{job}-p{part}"
        writer = DataWriter(o, job, attempt, {P_KIND: "stream", P_JOB: job, P_QUERY: query, P_BATCH: str(batch_id)},
                            lambda group, n, msgs: f"{prefix}-{group}-c{n}-{content_hash(msgs)}",
                            f"query {query} batch {batch_id}", self.route.only(cluster_job.all_groups), query=query)
        return writer.run(lambda w: w.write_rows(itertools.chain((first,), iterator)))

    def commit(self, messages, batchId: int) -> None:
        setup_logging()
        kept, what = Kept.of(messages), f"query {self.query} batch {batchId}"
        with self._jobs() as jobs:
            job = jobs.find(self._name(batchId))
            if job is None:
                return  # no rows: no job
            info = job.info
            if info.state == COMMITTED:
                log.warning("%s was already committed (job %s, %d transactions): a replay; %d of its prepares were "
                            "duplicates", what, info.job_id, info.members, kept.duplicates)
                return
            if kept.jobs - {info.job_id}:
                raise RuntimeError(f"txbroker: {what}: tasks sent into jobs {sorted(kept.jobs)}, but the batch's job "
                                   f"is now {info.job_id}; restart the query to publish the batch again")
            if not kept.count:
                jobs.abort(job)
                return
            decide_commit(self.o, jobs, job, what, kept, batchId)

    def abort(self, messages, batchId: int) -> None:
        setup_logging()
        with self._jobs() as jobs:
            job = jobs.find(self._name(batchId))
            if job is None or job.info.state == ABORTED:
                return
            abort_job(jobs, job, f"query {self.query} batch {batchId}", "; the restarted query replays it in a new job")
