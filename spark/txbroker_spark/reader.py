"""A batch read (`spark.read.format("txbroker")...load()`), Spark's Scan: one input partition per queue
and offset range (startingOffsets / endingOffsets, latest as of planning), read with pull requests as
a consumer reads them. On a TxBroker of several broker groups, every group's queues, with end
offsets planned where no job spanning groups is visible on some of its groups and not on others
(`_settled_ends`): a read never holds part of a committed job.
"""

from __future__ import annotations

import asyncio
import datetime as _dt

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType,
)

from txbroker.client import background
from txbroker.client.cluster.route import RouteBook
from txbroker.client.connection import BrokerClient
from txbroker.client.consumer import AsyncPullConsumer
from txbroker.client.errors import BrokerError, TlsHandshakeError
from txbroker.protocol.bodies import JobsSettledRequest, JobsSettledResponse
from txbroker.protocol.cluster import ClusterRoute
from txbroker.protocol.codes import RequestCode

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
    def __init__(self, queue_id: int, start: int, end: int, group: str = "", addresses: tuple[str, ...] = ()):
        super().__init__((group, queue_id, start, end))
        self.queue_id, self.start, self.end = queue_id, start, end
        self.group, self.addresses = group, addresses  # the broker group the queue is on (a cluster's)


SETTLE_ATTEMPTS = 50


class TxBrokerReader(DataSourceReader):
    def __init__(self, options):
        self.o = parse_read_options(options)

    def partitions(self):
        o = self.o
        count = probe_brokers(o.brokers, o.topic, security=o.security)
        if count is None:
            raise OptionError("topic", f"topic {o.topic} does not exist on {','.join(o.brokers)}")
        route = _named(o.security, lambda: background.run(_route(o)))
        groups = [g for g in route.groups]
        if len(groups) > 1 and (o.queues is not None or o.starting or o.ending):
            raise OptionError("queues" if o.queues is not None else "startingOffsets",
                              f"the topic is spread over {len(groups)} broker groups ({', '.join(g.name for g in groups)}): "
                              "queues and offsets name one group's queues; read the whole topic (or one group's "
                              "broker outside a cluster)")
        ends = _named(o.security, lambda: background.run(_settled_ends(o, groups)))
        out = []
        for g in groups:
            latest = ends[g.name]
            queues = o.queues if o.queues is not None else sorted(latest)
            bad = [q for q in queues if q not in latest]
            if bad:
                raise OptionError("queues", f"topic {o.topic} has queues 0..{len(latest) - 1}; no queue {bad[0]}")
            for q in queues:
                start = (o.starting or {}).get(q, 0)
                end = min((o.ending or {}).get(q, latest[q]), latest[q])
                if start < end:
                    out.append(QueueRange(q, start, end, g.name, tuple(g.addresses)))
        return out or [QueueRange(-1, 0, 0)]

    def read(self, partition: QueueRange):
        if partition.queue_id < 0:
            return
        o = self.o
        consumer = AsyncPullConsumer(list(partition.addresses) or o.brokers, request_timeout=o.request_timeout,
                                     **o.security.client_kwargs())
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


async def _route(o) -> ClusterRoute:
    book = RouteBook(o.brokers, request_timeout=o.request_timeout, **o.security.client_kwargs())
    try:
        return await book.fetch()
    finally:
        await book.close()


async def _settled_ends(o, groups) -> dict[str, dict[int, int]]:
    """Each group's queue ends, taken where every job spanning groups is visible on all of its groups
    or on none: between two answers of every group's master (QUERY_JOBS_SETTLED) that name no job
    decided and not yet visible everywhere, and no new decision. (Within a group a job is readable
    whole by construction; across groups only such a point makes it so.)"""
    clients = {g.name: BrokerClient(g.addresses, request_timeout=o.request_timeout, **o.security.client_kwargs())
               for g in groups}
    readers = {g.name: AsyncPullConsumer(g.addresses, request_timeout=o.request_timeout, **o.security.client_kwargs())
               for g in groups}
    try:
        async def settled():
            out = {}
            for name, c in clients.items():
                out[name] = await c.request(RequestCode.QUERY_JOBS_SETTLED, JobsSettledRequest(), JobsSettledResponse)
            return out

        async def ends():
            out = {}
            for name, r in readers.items():
                count = await r.queue_count(o.topic)
                out[name] = {q: (await r.pull(o.topic, q, 0, 1)).max_offset for q in range(count)}
            return out

        if len(groups) == 1:
            return await ends()
        delay = 0.02
        for _ in range(SETTLE_ATTEMPTS):
            before = await settled()
            if not any(s.unsettled for s in before.values()):
                taken = await ends()
                after = await settled()
                if after == before:
                    return taken
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        waiting = sorted({j for s in before.values() for j in s.unsettled})
        raise RuntimeError(f"txbroker: topic {o.topic}: no point found where every job spanning broker groups is "
                           f"visible on all of its groups or none ({SETTLE_ATTEMPTS} tries; still resolving: "
                           f"{', '.join(waiting[:5]) or 'new decisions kept coming'}); read again")
    finally:
        for c in clients.values():
            await c.close()
        for r in readers.values():
            await r.close()
