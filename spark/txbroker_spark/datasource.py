"""The `txbroker` PySpark data source: transactional batch and streaming writes, and reads.

Every write is one coordinated transaction on the broker (a job, broker/transaction/jobs.py): the decision is a
record in the broker's log, so no ledger, checker process or shared volume is involved.

Batch write (`df.write.format("txbroker")...save()`):
  driver, planning   checks the options (fails fast naming the option), probes the brokers, opens the
                     job by name (option jobId, else a new name) with the deadline deadlineSeconds.
  each task attempt  sends its rows as half messages joining the job, `batchSize` rows per
                     transaction, with ids `<job>-p<partition>-t<task attempt id>-c<n>` (unique to the
                     attempt); returns the ids in its commit message.
  driver, commit()   one DECIDE_JOB: COMMIT with exactly the ids of the attempts Spark kept. The
                     broker ends every member itself: the kept ones become visible, the transactions of
                     attempts Spark discarded (failed, retried, speculative losers, lost executors) are
                     rolled back. commit=deferred records the member list instead (PREPARE_JOB) and
                     leaves the decision to the application (deferred.py).
  driver, abort()    ABORT: the broker rolls back every member.
  driver lost        before its decision, the broker aborts the job at its deadline; after it, the
                     broker has already everything it needs.

Streaming write (`writeStream.format("txbroker")`): one job per micro-batch, named
`<query>.b<batch>`, which the tasks open (the first one creates it, the others find it).
Transaction ids are `<job id>-p<partition>-c<n>-<content hash>`: a batch replayed after a restart
into the same open job sends the same ids, which the broker recognises as duplicates; a batch whose
job was already committed sends nothing and its commit is a no-op; after an abort (or the deadline)
the replay opens a new job, so rolled-back ids are never reused.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlparse

from pyspark.sql.datasource import (
    DataSource, DataSourceArrowWriter, DataSourceReader, DataSourceStreamWriter, InputPartition, WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType,
)

from txbroker.protocol.names import PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS

from txbroker_spark.jobs import COMMITTED, OPEN, JobAborted, Jobs, check_name
from txbroker_spark.options import (
    P_ATTEMPT, P_BATCH, P_JOB, P_KIND, P_PARTITION, P_QUERY, OptionError, WriteOptions,
    parse_read_options, parse_write_options,
)
from txbroker_spark.publisher import MessageBuilder, TaskPublisher, content_hash, probe_brokers

log = logging.getLogger("txbroker_spark")
TASK_PROGRESS_SECONDS = 30.0  # a long task logs its rows sent so far this often (in the executor's log)

READ_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("queue_id", IntegerType(), False),
    StructField("queue_offset", LongType(), False),
    StructField("msg_id", StringType(), False),
    StructField("key", StringType(), True),
    StructField("tags", StringType(), True),
    StructField("body", BinaryType(), False),
    StructField("born_timestamp", TimestampType(), True),
    StructField("transaction_id", StringType(), True),
    StructField("properties", MapType(StringType(), StringType()), True),
])


def _setup_logging() -> None:
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(asctime)s txbroker-spark %(levelname)s %(message)s"))
        log.addHandler(h)
        log.setLevel(os.environ.get("TXBROKER_SPARK_LOG", "INFO").upper())
        log.propagate = False


def new_job_id(prefix: str = "j") -> str:
    return f"{prefix}{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def _task_context():
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:  # pragma: no cover - write() always runs in a task
        raise RuntimeError("txbroker: write() must run inside a Spark task")
    return tc


def _hang(o: WriteOptions, where: str, detail: dict) -> None:
    """Test hook: announce the point in a marker file, then wait to be killed, or released by a file
    `<marker>.release` (a driver paused and resumed), at most 10 min."""
    if o.hang_at != where:
        return
    release = None
    if o.marker_file:
        release = o.marker_file + ".release"
        tmp = o.marker_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"at": where, "pid": os.getpid(), **detail}, f)
        os.replace(tmp, o.marker_file)
    log.warning("inject.hangAt=%s: waiting here to be killed or released (%s)", where, detail)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if release and os.path.exists(release):
            log.warning("inject.hangAt=%s: released, going on", where)
            return
        time.sleep(0.2)
    raise RuntimeError(f"inject.hangAt={where}: nobody killed this process within 10 minutes")


def _inject_after_send(o: WriteOptions, partition: int, attempt_number: int, pub: TaskPublisher) -> None:
    """Test hooks that run once the task's half messages are all stored."""
    if o.slow_partition == partition and attempt_number == 0 and o.slow_seconds:
        log.warning("inject.slowPartition=%d: attempt 0 sleeps %.1fs after sending", partition, o.slow_seconds)
        if o.marker_file:  # tell a test which process to kill (an executor lost mid-write)
            tmp = o.marker_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"at": "slow", "pid": os.getpid(), "partition": partition, "txids": pub.txids}, f)
            os.replace(tmp, o.marker_file)
        time.sleep(o.slow_seconds)
    if o.fail_partition != partition or (attempt_number != 0 and o.fail_mode != "always"):
        return
    if o.fail_mode == "crash":
        if o.marker_file:  # tell a test what the dying attempt stored
            tmp = o.marker_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"at": "crash", "pid": os.getpid(), "partition": partition, "txids": pub.txids}, f)
            os.replace(tmp, o.marker_file)
        log.warning("inject.failPartition=%d: attempt %d crashes (its Python worker exits) after sending %d half "
                    "transactions", partition, attempt_number, len(pub.txids))
        sys.stderr.flush()
        os._exit(17)
    raise RuntimeError(f"inject.failPartition={partition}: attempt {attempt_number} fails after sending "
                       f"{len(pub.txids)} half transactions")


def _jobs(o: WriteOptions) -> Jobs:
    return Jobs(o.brokers, o.group, o.security, o.request_timeout)


@dataclass
class TxCommitMessage(WriterCommitMessage):
    job: str
    partition: int
    task_attempt_id: int
    attempt_number: int
    txids: list[str] = field(default_factory=list)
    rows: int = 0
    duplicates: int = 0
    query: str = ""
    batch_id: int = -1


def _decide_commit(o: WriteOptions, jobs: Jobs, job: str, what: str, txids: list[str], rows: int, hang: bool) -> None:
    """The commit point (one request), then wait until the broker made it visible."""
    if hang:
        _hang(o, "before-decision", {"job": job, "txids": len(txids)})
    t0 = time.monotonic()
    try:
        jobs.commit(job, txids)
    except JobAborted as e:
        raise RuntimeError(f"txbroker: {what}: the broker refused the commit ({e}); nothing of it was "
                           "published") from None
    if hang:
        _hang(o, "after-decision", {"job": job, "txids": len(txids)})
    info = jobs.wait_resolved(job, o.request_timeout)
    log.info("%s: committed %d rows in %d transactions (job %s; decision and visibility %.3fs)", what, rows,
             len(txids), job, time.monotonic() - t0)
    if not info.resolved:
        log.warning("%s: the decision is recorded; the broker is still ending %d members", what, info.pending)


# ---- batch -----------------------------------------------------------------------------------

class TxBrokerBatchWriter(DataSourceArrowWriter):
    def __init__(self, o: WriteOptions):
        _setup_logging()
        self.o = o
        probe_brokers(o.brokers, o.topic, security=o.security, group=o.group)
        self.name = check_name("jobId", o.job_id or new_job_id())
        with _jobs(o) as jobs:
            info = jobs.open(self.name, o.deadline_ms / 1000)
        if info.state != OPEN:
            raise OptionError("jobId", f"job {self.name} is already {info.state} on the broker (job id "
                                       f"{info.job_id}); use a new id")
        self.job = info.job_id
        log.info("job %s: publishing to %s as group %s (broker job %s, deadline in %.0fs; %s)", self.name, o.topic,
                 o.group, self.job, (info.deadline_ms - time.time() * 1000) / 1000, o.security.describe())

    def write(self, iterator) -> TxCommitMessage:
        _setup_logging()
        o, job = self.o, self.job
        tc = _task_context()
        part, attempt_no, tid = tc.partitionId(), tc.attemptNumber(), tc.taskAttemptId()
        props = {P_KIND: "batch", P_JOB: job, P_PARTITION: str(part), P_ATTEMPT: str(tid)}
        if o.immunity_seconds:
            props[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(o.immunity_seconds)
        prefix = f"{job}-p{part}-t{tid}"
        pub = TaskPublisher(o, lambda n, msgs: f"{prefix}-c{n}", job_id=job)
        builder = MessageBuilder(o, props)
        t0 = time.monotonic()
        next_report = t0 + TASK_PROGRESS_SECONDS
        try:
            row = 0
            for batch in iterator:
                if batch.num_rows:
                    pub.add(builder.from_arrow(batch, row))
                    row += batch.num_rows
                    now = time.monotonic()  # once per Arrow batch (thousands of rows): nothing on the hot path
                    if now >= next_report:
                        next_report = now + TASK_PROGRESS_SECONDS
                        log.info("job %s partition %d attempt %d: %d rows sent in %d half transactions so far (%.0fs)",
                                 job, part, tid, pub.rows, len(pub.txids), now - t0)
            pub.finish()
            _inject_after_send(o, part, attempt_no, pub)
        except BaseException:
            # Nothing to roll back here: the job's decision names only the attempts Spark keeps, and
            # the broker rolls back every other member.
            pub.abandon()
            raise
        finally:
            pub.close()
        log.info("job %s partition %d attempt %d (#%d): %d rows in %d half transactions in %.2fs",
                 job, part, tid, attempt_no, pub.rows, len(pub.txids), time.monotonic() - t0)
        return TxCommitMessage(job, part, tid, attempt_no, pub.txids, pub.rows, pub.duplicates)

    def commit(self, messages) -> None:
        _setup_logging()
        o, job = self.o, self.job
        msgs = [m for m in messages if m is not None]
        txids = [t for m in msgs for t in m.txids]
        rows = sum(m.rows for m in msgs)
        with _jobs(o) as jobs:
            if o.commit == "deferred":
                jobs.prepare(job, txids)
                log.info("job %s: %d rows in %d half transactions prepared; the application decides (deferred "
                         "commit)", self.name, rows, len(txids))
                return
            _decide_commit(o, jobs, job, f"job {self.name}", txids, rows, hang=True)

    def abort(self, messages) -> None:
        _setup_logging()
        with _jobs(self.o) as jobs:
            info = jobs.abort(self.job)
        if info.state == COMMITTED:  # commit() failed after its decision: the decision stands
            log.error("job %s: abort after the COMMIT decision; the decision stands", self.name)
            return
        log.warning("job %s aborted: the broker rolls back its %d stored half transactions", self.name, info.pending)


# ---- streaming -------------------------------------------------------------------------------

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
        _setup_logging()
        self.o = o
        self.query = stream_identity(o)
        probe_brokers(o.brokers, o.topic, security=o.security, group=o.group)

    def _name(self, batch_id: int) -> str:
        return f"{self.query}.b{batch_id}"

    def write(self, iterator) -> TxCommitMessage:
        _setup_logging()
        o, query = self.o, self.query
        tc = _task_context()
        part, attempt_no, tid = tc.partitionId(), tc.attemptNumber(), tc.taskAttemptId()
        batch_id = int(tc.getLocalProperty("streaming.sql.batchId") or -1)
        if batch_id < 0:
            raise RuntimeError("txbroker: streaming write outside a micro-batch (no batch id)")
        first = next(iterator, None)
        if first is None:  # nothing in this partition: no job needed
            return TxCommitMessage("", part, tid, attempt_no, query=query, batch_id=batch_id)
        with _jobs(o) as jobs:
            info = jobs.open(self._name(batch_id), o.deadline_ms / 1000)
        job = info.job_id
        if info.state == COMMITTED:  # a replay of a batch whose decision was COMMIT: already published
            log.info("query %s batch %d partition %d: job %s already committed; sending nothing", query, batch_id,
                     part, job)
            return TxCommitMessage(job, part, tid, attempt_no, query=query, batch_id=batch_id)
        if info.state != OPEN:
            raise RuntimeError(f"txbroker: query {query} batch {batch_id}: job {job} is {info.state}; it takes no "
                               "new members")
        props = {P_KIND: "stream", P_JOB: job, P_QUERY: query, P_BATCH: str(batch_id), P_PARTITION: str(part),
                 P_ATTEMPT: str(tid)}
        if o.immunity_seconds:
            props[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(o.immunity_seconds)
        prefix = f"{job}-p{part}"
        pub = TaskPublisher(o, lambda n, msgs: f"{prefix}-c{n}-{content_hash(msgs)}", job_id=job)
        builder = MessageBuilder(o, props)
        try:
            chunk, row = [first], 0
            for r in iterator:
                chunk.append(r)
                if len(chunk) >= o.batch_size:
                    pub.add(builder.from_rows(chunk, row))
                    row += len(chunk)
                    chunk = []
            if chunk:
                pub.add(builder.from_rows(chunk, row))
            pub.finish()
            _inject_after_send(o, part, attempt_no, pub)
        except BaseException:
            pub.abandon()  # what is not in the batch's decision the broker rolls back
            raise
        finally:
            pub.close()
        log.info("query %s batch %d partition %d attempt %d: %d rows in %d half transactions (%d duplicates)",
                 query, batch_id, part, tid, pub.rows, len(pub.txids), pub.duplicates)
        return TxCommitMessage(job, part, tid, attempt_no, pub.txids, pub.rows, pub.duplicates, query, batch_id)

    def commit(self, messages, batchId: int) -> None:
        _setup_logging()
        o = self.o
        msgs = [m for m in messages if m is not None]
        txids = [t for m in msgs for t in m.txids]
        rows = sum(m.rows for m in msgs)
        what = f"query {self.query} batch {batchId}"
        with _jobs(o) as jobs:
            info = jobs.find(self._name(batchId))
            if info is None:
                return  # no rows: no job
            if info.state == COMMITTED:
                log.warning("%s was already committed (job %s, %d transactions): a replay; %d of its prepares were "
                            "duplicates", what, info.job_id, info.members, sum(m.duplicates for m in msgs))
                return
            jobs_seen = {m.job for m in msgs if m.txids}
            if jobs_seen - {info.job_id}:
                raise RuntimeError(f"txbroker: {what}: tasks sent into jobs {sorted(jobs_seen)}, but the batch's job "
                                   f"is now {info.job_id}; restart the query to publish the batch again")
            if not txids:
                jobs.abort(info.job_id)
                return
            hang = o.hang_batch is None or o.hang_batch == batchId
            _decide_commit(o, jobs, info.job_id, what, txids, rows, hang)

    def abort(self, messages, batchId: int) -> None:
        _setup_logging()
        with _jobs(self.o) as jobs:
            info = jobs.find(self._name(batchId))
            if info is None or info.state != OPEN:
                if info is not None and info.state == COMMITTED:
                    log.error("query %s batch %d: abort of an already committed batch; the decision stands",
                              self.query, batchId)
                return
            info = jobs.abort(info.job_id)
        log.warning("query %s batch %d aborted (job %s); the restarted query replays it in a new job", self.query,
                    batchId, info.job_id)


# ---- read ------------------------------------------------------------------------------------

def _named(security, call):
    """Run `call`; a refusal of the credentials, their rights or TLS is raised naming the option."""
    from txbroker.client.errors import BrokerError, TlsHandshakeError

    try:
        return call()
    except (BrokerError, TlsHandshakeError) as e:
        named = security.refusal(e)
        if named is None:
            raise
        raise named from None


class QueueRange(InputPartition):
    def __init__(self, queue_id: int, start: int, end: int):
        super().__init__((queue_id, start, end))
        self.queue_id, self.start, self.end = queue_id, start, end


class TxBrokerReader(DataSourceReader):
    def __init__(self, options):
        self.o = parse_read_options(options)

    def partitions(self):
        from txbroker.client import background
        from txbroker.client.consumer import AsyncPullConsumer

        o = self.o
        count = probe_brokers(o.brokers, o.topic, security=o.security)
        if count is None:
            raise OptionError("topic", f"topic {o.topic} does not exist on {','.join(o.brokers)}")
        queues = o.queues if o.queues is not None else list(range(count))
        bad = [q for q in queues if not 0 <= q < count]
        if bad:
            raise OptionError("queues", f"topic {o.topic} has queues 0..{count - 1}; no queue {bad[0]}")

        async def ends():
            c = AsyncPullConsumer(o.brokers, request_timeout=o.request_timeout, **o.security.client_kwargs())
            try:
                return {q: (await c.pull(o.topic, q, 0, 1)).max_offset for q in queues}
            finally:
                await c.close()

        latest = _named(o.security, lambda: background.run(ends()))
        out = []
        for q in queues:
            start = (o.starting or {}).get(q, 0)
            end = min((o.ending or {}).get(q, latest[q]), latest[q])
            if start < end:
                out.append(QueueRange(q, start, end))
        return out or [QueueRange(-1, 0, 0)]

    def read(self, partition: QueueRange):
        from txbroker.client import background
        from txbroker.client.consumer import AsyncPullConsumer

        if partition.queue_id < 0:
            return
        o = self.o
        consumer = AsyncPullConsumer(o.brokers, request_timeout=o.request_timeout, **o.security.client_kwargs())
        utc = _dt.timezone.utc
        try:
            offset = partition.start
            while offset < partition.end:
                r = _named(o.security, lambda: background.run(consumer.pull(
                    o.topic, partition.queue_id, offset, min(o.pull_batch, partition.end - offset))))
                if not r.messages:
                    break
                for m in r.messages:
                    if m.queue_offset >= partition.end:
                        return
                    yield (m.topic, m.queue_id, m.queue_offset, m.msg_id, m.keys, m.tags, m.body,
                           _dt.datetime.fromtimestamp(m.born_timestamp / 1000, utc) if m.born_timestamp else None,
                           m.transaction_id, dict(m.properties))
                offset = r.next_offset
        finally:
            background.run(consumer.close())


# ---- the source ------------------------------------------------------------------------------

class TxBrokerDataSource(DataSource):
    """`format("txbroker")`: see the package's README for the options."""

    @classmethod
    def name(cls) -> str:
        return "txbroker"

    def schema(self):
        return READ_SCHEMA

    def reader(self, schema) -> TxBrokerReader:
        return TxBrokerReader(self.options)

    def writer(self, schema, overwrite: bool) -> TxBrokerBatchWriter:
        if overwrite:
            raise OptionError("mode", "a topic cannot be overwritten; use mode('append')")
        return TxBrokerBatchWriter(parse_write_options(self.options, schema, streaming=False))

    def streamWriter(self, schema, overwrite: bool) -> TxBrokerStreamWriter:
        if overwrite:
            raise OptionError("outputMode", "a topic cannot be overwritten; use outputMode('append')")
        return TxBrokerStreamWriter(parse_write_options(self.options, schema, streaming=True))
