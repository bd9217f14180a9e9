"""The `txbroker` PySpark data source: transactional batch and streaming writes, and reads.

Batch write (`df.write.format("txbroker")...save()`):
  driver, planning   checks the options (fails fast naming the option), probes the brokers, registers
                     the job in the ledger (driver host/pid, deadline) and picks a job id.
  each task attempt  sends its rows as half messages, `batchSize` rows per transaction, with ids
                     `<job>-p<partition>-t<task attempt id>-c<n>` (unique to the attempt), each
                     message carrying the job id; returns the ids in its commit message.
  driver, commit()   records COMMITTED with exactly the ids of the attempts Spark kept, then sends
                     the ENDs (pipelined). Transactions of attempts Spark discarded (failed, retried,
                     speculative losers, lost executors) are not in the decision: check-back rolls
                     them back from the ledger.
  driver, abort()    records ABORTED and rolls back the ids it knows; check-back does the rest.

Streaming write (`writeStream.format("txbroker")`): the same per micro-batch. Transaction ids are
`s<query>-b<batch>-e<epoch>-p<partition>-c<n>-<content hash>`: a batch replayed from the
checkpoint sends the same ids, which the broker recognises as duplicates (nothing new stored), and
its commit finds the batch already decided in the ledger and only re-sends the (idempotent) ENDs.
The epoch changes only after a batch is aborted, so a replay never reuses rolled-back ids.
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

from txbroker.protocol.codes import TransactionState

from txbroker_spark.ledger import ABORTED, COMMITTED, Decision, Ledger
from txbroker_spark.options import (
    P_ATTEMPT, P_BATCH, P_EPOCH, P_IMMUNITY, P_JOB, P_KIND, P_PARTITION, P_QUERY, OptionError, WriteOptions,
    parse_read_options, parse_write_options,
)
from txbroker_spark.publisher import MessageBuilder, TaskPublisher, content_hash, end_all, probe_brokers

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
    """Test hook: announce the point in a marker file, then wait to be killed (at most 10 min)."""
    if o.hang_at != where:
        return
    if o.marker_file:
        tmp = o.marker_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"at": where, "pid": os.getpid(), **detail}, f)
        os.replace(tmp, o.marker_file)
    log.warning("inject.hangAt=%s: waiting here to be killed (%s)", where, detail)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(0.5)
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
        log.warning("inject.failPartition=%d: attempt %d crashes (its Python worker exits) after sending %d half "
                    "transactions", partition, attempt_number, len(pub.txids))
        sys.stderr.flush()
        os._exit(17)
    raise RuntimeError(f"inject.failPartition={partition}: attempt {attempt_number} fails after sending "
                       f"{len(pub.txids)} half transactions")


def _attempts(msgs) -> list[dict]:
    return [{"partition": m.partition, "task_attempt_id": m.task_attempt_id, "attempt_number": m.attempt_number,
             "rows": m.rows, "transactions": len(m.txids)} for m in sorted(msgs, key=lambda m: m.partition)]


def _ends(o: WriteOptions, txids, state: TransactionState):
    return end_all(o.brokers, o.group, txids, state, request_timeout=o.request_timeout, security=o.security)


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
    epoch: int = 0


# ---- batch -----------------------------------------------------------------------------------

class TxBrokerBatchWriter(DataSourceArrowWriter):
    def __init__(self, o: WriteOptions):
        _setup_logging()
        self.o = o
        probe_brokers(o.brokers, o.topic, security=o.security, group=o.group)
        ledger = Ledger(o.ledger).ensure()
        self.job = o.job_id or new_job_id()
        if ledger.job_decision(self.job) is not None:
            raise OptionError("jobId", f"job {self.job} is already decided in the ledger {o.ledger}; use a new id")
        ledger.register_job(self.job, deadline_ms=o.deadline_ms, meta={
            "kind": "batch", "group": o.group, "topic": o.topic, "commit": o.commit})
        log.info("job %s: publishing to %s as group %s (ledger %s; %s)", self.job, o.topic, o.group, o.ledger,
                 o.security.describe())

    def write(self, iterator) -> TxCommitMessage:
        _setup_logging()
        o, job = self.o, self.job
        tc = _task_context()
        part, attempt_no, tid = tc.partitionId(), tc.attemptNumber(), tc.taskAttemptId()
        props = {P_KIND: "batch", P_JOB: job, P_PARTITION: str(part), P_ATTEMPT: str(tid)}
        if o.immunity_seconds:
            props[P_IMMUNITY] = str(o.immunity_seconds)
        prefix = f"{job}-p{part}-t{tid}"
        pub = TaskPublisher(o, lambda n, msgs: f"{prefix}-c{n}")
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
        except BaseException as e:
            pub.abandon()
            if pub.txids:  # this attempt will never be committed: roll back what it stored (best effort)
                try:
                    rep = _ends(o, pub.txids, TransactionState.ROLLBACK)
                    log.warning("job %s partition %d attempt %d failed (%s); rolled back its half transactions: %s",
                                job, part, tid, e, rep.summary())
                except Exception as end_error:  # noqa: BLE001 - check-back will roll them back
                    log.warning("job %s partition %d attempt %d: rollback failed (%s); check-back will do it",
                                job, part, tid, end_error)
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
        dups = sum(m.duplicates for m in msgs)
        ledger = Ledger(o.ledger)
        if o.commit == "deferred":
            ledger.save_prepared(job, txids, rows, dups, _attempts(msgs))
            log.info("job %s: %d rows in %d half transactions prepared; the application decides (deferred commit)",
                     job, rows, len(txids))
            return
        _hang(o, "before-decision", {"job": job, "txids": len(txids)})
        d = ledger.decide_job(job, Decision(COMMITTED, txids, by="driver", rows=rows, duplicates=dups,
                                            attempts=_attempts(msgs)))
        if not d.committed:
            _ends(o, txids, TransactionState.ROLLBACK)
            raise RuntimeError(f"txbroker: job {job} was {d.decision} by {d.by} ({d.reason}) before the driver could "
                               "commit it; nothing of it was published")
        _hang(o, "after-decision", {"job": job, "txids": len(txids)})
        rep = _ends(o, d.txids, TransactionState.COMMIT)
        _report_commit(f"job {job}", rows, d.txids, rep)

    def abort(self, messages) -> None:
        _setup_logging()
        o, job = self.o, self.job
        known = [t for m in messages if m is not None for t in m.txids]
        ledger = Ledger(o.ledger)
        d = ledger.decide_job(job, Decision(ABORTED, [], reason="the Spark job failed", by="driver"))
        if d.committed:  # commit() failed after recording its decision: the decision stands
            rep = _ends(o, d.txids, TransactionState.COMMIT)
            log.error("job %s: abort after a recorded COMMIT decision; the decision stands: %s", job, rep.summary())
            return
        rep = _ends(o, known, TransactionState.ROLLBACK)
        log.warning("job %s aborted: rolled back %d known half transactions (%s); check-back rolls back the rest",
                    job, len(known), rep.summary())


def _report_commit(what: str, rows: int, txids, rep) -> None:
    if rep.refused:
        sample = dict(list(rep.refused.items())[:3])
        raise RuntimeError(f"txbroker: {what}: the broker refused {len(rep.refused)} of {len(txids)} commits after "
                           f"the decision was recorded (someone decided them the other way?): {sample}")
    if rep.undelivered:
        log.error("%s: decision COMMITTED recorded, but %d of %d ENDs were not delivered (%s); the ledger checker "
                  "will commit them at check-back", what, len(rep.undelivered), len(txids),
                  next(iter(rep.undelivered.values())))
    else:
        log.info("%s: committed %d rows in %d transactions (%d already committed)", what, rows, len(txids),
                 rep.already)


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
        ledger = Ledger(o.ledger).ensure()
        ledger.register_stream_driver(self.query, deadline_ms=o.deadline_ms)
        self.epoch = ledger.stream_epoch(self.query)

    def write(self, iterator) -> TxCommitMessage:
        _setup_logging()
        o, query, epoch = self.o, self.query, self.epoch
        tc = _task_context()
        part, attempt_no, tid = tc.partitionId(), tc.attemptNumber(), tc.taskAttemptId()
        batch_id = int(tc.getLocalProperty("streaming.sql.batchId") or -1)
        if batch_id < 0:
            raise RuntimeError("txbroker: streaming write outside a micro-batch (no batch id)")
        job = f"{query}.b{batch_id}.e{epoch}"
        props = {P_KIND: "stream", P_JOB: job, P_QUERY: query, P_BATCH: str(batch_id), P_EPOCH: str(epoch),
                 P_PARTITION: str(part), P_ATTEMPT: str(tid)}
        if o.immunity_seconds:
            props[P_IMMUNITY] = str(o.immunity_seconds)
        prefix = f"s{query}-b{batch_id}-e{epoch}-p{part}"
        pub = TaskPublisher(o, lambda n, msgs: f"{prefix}-c{n}-{content_hash(msgs)}")
        builder = MessageBuilder(o, props)
        try:
            chunk, row = [], 0
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
            # No rollback here: a replay or another attempt may send the very same ids (same rows);
            # whatever is not in the batch's decision is rolled back by commit() or check-back.
            pub.abandon()
            raise
        finally:
            pub.close()
        if pub.txids:
            log.info("query %s batch %d partition %d attempt %d: %d rows in %d half transactions (%d duplicates)",
                     query, batch_id, part, tid, pub.rows, len(pub.txids), pub.duplicates)
        return TxCommitMessage(job, part, tid, attempt_no, pub.txids, pub.rows, pub.duplicates, query, batch_id,
                               epoch)

    def _ident(self, msgs, batch_id: int) -> tuple[str, int]:
        ids = {(m.query, m.epoch) for m in msgs}
        if len(ids) > 1:
            raise RuntimeError(f"txbroker: batch {batch_id} got commit messages of several queries/epochs: {ids}")
        return ids.pop() if ids else (self.query, self.epoch)

    def commit(self, messages, batchId: int) -> None:
        _setup_logging()
        o = self.o
        msgs = [m for m in messages if m is not None]
        query, epoch = self._ident(msgs, batchId)
        txids = [t for m in msgs for t in m.txids]
        rows = sum(m.rows for m in msgs)
        dups = sum(m.duplicates for m in msgs)
        ledger = Ledger(o.ledger)
        prior = ledger.committed_batch(query, batchId)
        if prior is not None:
            e, d = prior
            decided = set(d.txids)
            rep = _ends(o, d.txids, TransactionState.COMMIT)
            extra = [t for t in txids if t not in decided]
            _ends(o, extra, TransactionState.ROLLBACK)
            log.warning("query %s batch %d was already committed (epoch %d, %d transactions): a replay; "
                        "%d of its prepares were duplicates, %d extra rolled back; ENDs: %s",
                        query, batchId, e, len(d.txids), dups, len(extra), rep.summary())
            if rep.refused:
                _report_commit(f"query {query} batch {batchId}", rows, d.txids, rep)
            return
        if not txids:
            return
        if o.hang_batch is None or o.hang_batch == batchId:
            _hang(o, "before-decision", {"query": query, "batch": batchId, "txids": len(txids)})
        d = ledger.decide_batch(query, batchId, epoch, Decision(COMMITTED, txids, by="driver", rows=rows,
                                                                duplicates=dups, attempts=_attempts(msgs)))
        if not d.committed:
            _ends(o, txids, TransactionState.ROLLBACK)
            raise RuntimeError(f"txbroker: query {query} batch {batchId} was {d.decision} by {d.by} ({d.reason}) "
                               "before the driver could commit it; restart the query to publish it again")
        if o.hang_batch is None or o.hang_batch == batchId:
            _hang(o, "after-decision", {"query": query, "batch": batchId, "txids": len(txids)})
        rep = _ends(o, d.txids, TransactionState.COMMIT)
        _report_commit(f"query {query} batch {batchId}", rows, d.txids, rep)

    def abort(self, messages, batchId: int) -> None:
        _setup_logging()
        o = self.o
        msgs = [m for m in messages if m is not None]
        query, epoch = self._ident(msgs, batchId)
        known = [t for m in msgs for t in m.txids]
        ledger = Ledger(o.ledger)
        prior = ledger.committed_batch(query, batchId)
        if prior is None:
            d = ledger.decide_batch(query, batchId, epoch, Decision(ABORTED, [], reason="micro-batch failed",
                                                                    by="driver"))
            prior = (epoch, d) if d.committed else None
        if prior is not None:
            decided = set(prior[1].txids)
            _ends(o, prior[1].txids, TransactionState.COMMIT)
            _ends(o, [t for t in known if t not in decided], TransactionState.ROLLBACK)
            log.error("query %s batch %d: abort of an already committed batch; the decision stands", query, batchId)
            return
        rep = _ends(o, known, TransactionState.ROLLBACK)
        log.warning("query %s batch %d aborted: %s; the next run uses epoch %d", query, batchId, rep.summary(),
                    epoch + 1)


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
