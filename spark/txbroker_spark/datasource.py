"""The `txbroker` PySpark data source: transactional batch and streaming writes, and reads.

Every write is one coordinated transaction on the broker (a job, broker/transaction/jobs.py): the
decision is a record in the broker's log, so no ledger, checker process or shared volume is involved.
One role per module, as in Spark's Kafka connector:

    datasource.py    this: format("txbroker"), its schema, and which class plans what
    batch_write.py   a batch write's driver side: plan (open the job), commit, abort
    stream_write.py  a streaming write's driver side, one job per micro-batch
    data_writer.py   a task attempt: its rows as half messages, its commit message
    commit.py        the driver's decide-then-end sequence, shared by both writes
    reader.py        a batch read
    publisher.py, messages.py, probe.py, jobs.py, options.py, security.py: what those use
    faults.py        the inject.* failure hooks of the tests and the demo (the one seam they enter by)
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from txbroker_spark.batch_write import TxBrokerBatchWriter
from txbroker_spark.jobs import new_job_id
from txbroker_spark.options import OptionError, parse_write_options
from txbroker_spark.reader import READ_SCHEMA, TxBrokerReader
from txbroker_spark.stream_write import TxBrokerStreamWriter

__all__ = ["TxBrokerDataSource", "new_job_id"]  # new_job_id: deferred commit names its job with it (README)


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
