"""A batch read (`spark.read.format("txbroker")...load()`), Spark's Scan: one input partition per queue
and offset range (startingOffsets / endingOffsets, latest as of planning), read with pull requests as
a consumer reads them.
"""

from __future__ import annotations

import datetime as _dt

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType,
)

from txbroker.client import background
from txbroker.client.consumer import AsyncPullConsumer
from txbroker.client.errors import BrokerError, TlsHandshakeError

from txbroker_spark.options import OptionError, parse_read_options
from txbroker_spark.probe import probe_brokers

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


def _named(security, call):
    """Run `call`; a refusal of the credentials, their rights or TLS is raised naming the option."""
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
