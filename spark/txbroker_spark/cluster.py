"""The broker groups a write spreads over, and where each row goes.

The driver learns the route from any broker of the TxBroker (option brokers: a broker address, or
`<name>-master`) and keeps it for the whole write: every task places rows by the route its driver
saw, so one write's placement never depends on when a task ran. A broker outside any cluster is a
route of one group; every write is then what it always was.

  keyColumn   one key, one queue, across runs: crc32(key) over every queue of the topic on the
              write's groups in route order (the cluster clients' key_selector, so a Spark write and
              a ClusterTransactionProducer put a key in the same place);
  otherwise   evenly: batchSize rows at a time, each task starting at another group.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from txbroker.client import background
from txbroker.client.cluster.route import RouteBook
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import BrokerError
from txbroker.client.producer import topic_queue_count
from txbroker.protocol.bodies import CreateTopicRequest, Message, RouteRequest, RouteResponse
from txbroker.protocol.cluster import ClusterRoute, GroupRoute
from txbroker.protocol.codes import RequestCode, ResponseCode

from txbroker_spark.option_values import OptionError


@dataclass(frozen=True)
class WriteRoute:
    """A write's groups (name, addresses) in route order, as its driver saw them, and the topic's
    queue count on each (for placement by key). Plain data: it travels to the executors."""

    cluster: str
    version: int
    groups: tuple[tuple[str, tuple[str, ...]], ...]
    counts: tuple[int, ...]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.groups]

    def addresses(self, group: str) -> list[str]:
        return next(list(a) for name, a in self.groups if name == group)

    def route(self) -> ClusterRoute:
        return ClusterRoute(self.cluster, self.version, [GroupRoute(n, list(a)) for n, a in self.groups])

    def only(self, groups: list[str]) -> "WriteRoute":
        """The same route, with just `groups` (a job's), in route order."""
        keep = [i for i, (name, _) in enumerate(self.groups) if name in groups]
        return WriteRoute(self.cluster, self.version, tuple(self.groups[i] for i in keep),
                          tuple(self.counts[i] for i in keep))


def learn_route(brokers: list[str], topic: str, security, request_timeout: float) -> WriteRoute:
    """The active groups of the cluster `brokers` belong to, with the topic's queue count on each
    (created where it is missing, with the count it has elsewhere, so keys land the same in every
    run). Refuses a route that lists no active group."""
    async def go() -> WriteRoute:
        book = RouteBook(brokers, request_timeout=request_timeout, **security.client_kwargs())
        try:
            route = await book.fetch()
        finally:
            await book.close()
        active = [g for g in route.groups if g.active]
        if not active:
            raise OptionError("brokers", f"cluster {route.cluster or '(one group)'} route version {route.version} "
                                         f"lists no active broker group ({', '.join(f'{g.name}: {g.state}' for g in route.groups)}): "
                                         "nothing can take a new write")
        counts: dict[str, int | None] = {}
        clients = {g.name: BrokerClient(g.addresses, request_timeout=request_timeout, **security.client_kwargs())
                   for g in active}
        try:
            for g in active:
                counts[g.name] = await _count(clients[g.name], topic)
            known = [n for n in counts.values() if n]
            for g in active:
                if counts[g.name] is None:  # created as a send would (the broker's default), or as elsewhere
                    counts[g.name] = (await _create(clients[g.name], topic, max(known)) if known
                                      else await topic_queue_count(clients[g.name], topic))
                    known.append(counts[g.name])
        finally:
            for c in clients.values():
                await c.close()
        return WriteRoute(route.cluster, route.version, tuple((g.name, tuple(g.addresses)) for g in active),
                          tuple(counts[g.name] or 0 for g in active))

    return background.run(go())


async def _count(client: BrokerClient, topic: str) -> int | None:
    try:
        r: RouteResponse = await client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, RouteRequest(topic), RouteResponse)
    except BrokerError as e:
        if e.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        raise
    return r.queue_count


async def _create(client: BrokerClient, topic: str, queues: int) -> int:
    await client.request(RequestCode.UPDATE_AND_CREATE_TOPIC, CreateTopicRequest(topic, queues))
    return queues


class RowPlacement:
    """Where a task's messages go: {group: messages}. Keyed rows get their queue id on that group."""

    def __init__(self, route: WriteRoute, keyed: bool, partition: int, batch_size: int):
        self.route = route
        self.keyed = keyed
        self.partition = partition
        self.batch_size = batch_size
        self._total = sum(route.counts)
        self._row = 0

    def split(self, msgs: list[Message]) -> dict[str, list[Message]]:
        names = self.route.names
        out: dict[str, list[Message]] = {}
        if len(names) == 1:  # one group: every row goes there; a keyed row only needs its queue
            if self.keyed:
                total, crc32 = self._total, zlib.crc32
                for m in msgs:
                    m.queue_id = crc32(m.keys.encode()) % total
            self._row += len(msgs)
            return {names[0]: msgs}
        counts = self.route.counts
        for m in msgs:
            if self.keyed:
                index = zlib.crc32(m.keys.encode()) % self._total
                for name, n in zip(names, counts):
                    if index < n:
                        m.queue_id = index
                        out.setdefault(name, []).append(m)
                        break
                    index -= n
            else:
                group = names[(self.partition + self._row // self.batch_size) % len(names)]
                out.setdefault(group, []).append(m)
            self._row += 1
        return out
