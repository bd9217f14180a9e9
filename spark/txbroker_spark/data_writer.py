"""The task side of a write, batch or streaming (Spark's DataWriter and WriteTask): one task
attempt's rows sent as half messages joining the write's job, and the commit message that tells the
driver which transactions the attempt stored.

Nothing is rolled back here when an attempt fails: the driver's decision names only the attempts
Spark keeps, and the broker rolls back every other member of the job.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from pyspark.sql.datasource import WriterCommitMessage

from txbroker.protocol.names import PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS

from txbroker_spark.cluster import RowPlacement, WriteRoute
from txbroker_spark.logs import log
from txbroker_spark.messages import MessageBuilder
from txbroker_spark.options import P_ATTEMPT, P_PARTITION, WriteOptions
from txbroker_spark.publisher import TaskPublisher

TASK_PROGRESS_SECONDS = 30.0  # a long task logs its rows sent so far this often (in the executor's log)


@dataclass
class TxCommitMessage(WriterCommitMessage):
    job: str  # the broker job the attempt's transactions joined ("" : an empty streaming partition)
    partition: int
    task_attempt_id: int
    attempt_number: int
    txids: dict[str, list[str]] = field(default_factory=dict)  # by broker group
    rows: int = 0
    duplicates: int = 0  # prepares the broker already had (a streaming replay): nothing new stored
    query: str = ""
    batch_id: int = -1


@dataclass(frozen=True)
class TaskAttempt:
    partition: int
    attempt_number: int  # 0 for a partition's first attempt
    task_attempt_id: int  # unique in the application: makes a batch attempt's transaction ids its own
    batch_id: int = -1  # the micro-batch of a streaming write; -1 otherwise

    @classmethod
    def current(cls) -> "TaskAttempt":
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is None:  # pragma: no cover - write() always runs in a task
            raise RuntimeError("txbroker: write() must run inside a Spark task")
        return cls(tc.partitionId(), tc.attemptNumber(), tc.taskAttemptId(),
                   int(tc.getLocalProperty("streaming.sql.batchId") or -1))

    def empty_commit(self, job: str, query: str) -> TxCommitMessage:
        """The commit message of an attempt that sent nothing."""
        return TxCommitMessage(job, self.partition, self.task_attempt_id, self.attempt_number, query=query,
                               batch_id=self.batch_id)


class DataWriter:
    """Sends one task attempt's rows as half messages joining `job` on the groups of `route` (each row
    where cluster.RowPlacement puts it): `props` on every message (with the partition and the
    attempt), `txid_for(group, chunk number, messages)` naming each transaction, `what` naming the
    write in logs."""

    def __init__(self, o: WriteOptions, job: str, attempt: TaskAttempt, props: dict[str, str], txid_for, what: str,
                 route: WriteRoute, query: str = ""):
        self.o, self.job, self.attempt, self.what, self.query = o, job, attempt, what, query
        props = {**props, P_PARTITION: str(attempt.partition), P_ATTEMPT: str(attempt.task_attempt_id)}
        if o.immunity_seconds:
            props[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(o.immunity_seconds)
        self.builder = MessageBuilder(o, props)
        self.route = route
        self.placement = RowPlacement(route, o.key_column is not None, attempt.partition, o.batch_size)
        self._txid_for = txid_for
        self.pubs: dict[str, TaskPublisher] = {}
        self.row = 0
        self.t0 = time.monotonic()
        self._next_report = self.t0 + TASK_PROGRESS_SECONDS

    def _pub(self, group: str) -> TaskPublisher:
        pub = self.pubs.get(group)
        if pub is None:
            pub = self.pubs[group] = TaskPublisher(self.o, lambda n, msgs: self._txid_for(group, n, msgs),
                                                   job_id=self.job, brokers=self.route.addresses(group),
                                                   group_name=group, properties=self.builder.properties)
        return pub

    def _send(self, msgs) -> None:
        for group, part in self.placement.split(msgs).items():
            self._pub(group).add(part)

    def run(self, feed) -> TxCommitMessage:
        """The whole attempt: `feed(self)` writes the rows; then every half message is awaited and
        the commit message returned. On failure the prepares in flight are let go; the clients
        are closed either way."""
        try:
            feed(self)
            return self.commit()
        except BaseException:
            for pub in self.pubs.values():
                pub.abandon()
            raise
        finally:
            for pub in self.pubs.values():
                pub.close()

    def write_arrow(self, batches) -> None:
        for batch in batches:
            if batch.num_rows:
                self._send(self.builder.from_arrow(batch, self.row))
                self._sent(batch.num_rows)

    def write_rows(self, rows) -> None:
        rows = iter(rows)
        while chunk := list(itertools.islice(rows, self.o.batch_size)):
            self._send(self.builder.from_rows(chunk, self.row))
            self._sent(len(chunk))

    def _sent(self, n: int) -> None:
        self.row += n
        now = time.monotonic()  # once per Arrow batch or chunk (thousands of rows): nothing on the hot path
        if now >= self._next_report:
            self._next_report = now + TASK_PROGRESS_SECONDS
            log.info("%s partition %d attempt %d: %d rows sent in %d half transactions so far (%.0fs)", self.what,
                     self.attempt.partition, self.attempt.task_attempt_id, sum(p.rows for p in self.pubs.values()),
                     sum(len(p.txids) for p in self.pubs.values()), now - self.t0)

    def commit(self) -> TxCommitMessage:
        a = self.attempt
        for pub in self.pubs.values():
            pub.finish()
        txids = {g: pub.txids for g, pub in self.pubs.items() if pub.txids}
        rows, dupes = sum(p.rows for p in self.pubs.values()), sum(p.duplicates for p in self.pubs.values())
        self.o.faults.after_send(a.partition, a.attempt_number, [t for ids in txids.values() for t in ids])
        log.info("%s partition %d attempt %d (#%d): %d rows in %d half transactions on %s (%d duplicates) in %.2fs",
                 self.what, a.partition, a.task_attempt_id, a.attempt_number, rows,
                 sum(len(ids) for ids in txids.values()), ", ".join(sorted(txids)) or "no group", dupes,
                 time.monotonic() - self.t0)
        return TxCommitMessage(self.job, a.partition, a.task_attempt_id, a.attempt_number, txids, rows, dupes,
                               self.query, a.batch_id)
