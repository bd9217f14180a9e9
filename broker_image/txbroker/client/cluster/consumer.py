"""Push consumers of a cluster of broker groups: one AsyncPushConsumer per group, all members of
the one consumer group. Each group divides its own queues of the topic among the members it knows
(every process runs a member on every group), keeps their offsets, and takes their retries and dead
letters (a message is sent back to the group that holds it); ordered consumption locks a queue on
its group. So a group failing over stops nothing on the others, and a group that joins the route is
consumed from its first message (the topic is created there if no producer has sent to it yet)."""

from __future__ import annotations

from txbroker.client import background
from txbroker.client.cluster.members import PerGroup
from txbroker.client.cluster.route import RouteBook
from txbroker.client.producer import topic_queue_count
from txbroker.client.push import AsyncPushConsumer, ConsumerStats
from txbroker.protocol.tags import parse_tags


class AsyncClusterPushConsumer:
    def __init__(self, group: str, bootstrap, topic: str, listener, *, route_refresh: float = 10.0,
                 request_timeout: float = 10.0, credentials=None, tls=None, **options):
        parse_tags(options.get("tags", "*"))  # a bad expression fails here, naming it
        self.group, self.topic, self.listener = group, topic, listener
        self._kwargs = dict(request_timeout=request_timeout, credentials=credentials, tls=tls, **options)
        self.routes = RouteBook(bootstrap, refresh=route_refresh, request_timeout=request_timeout,
                                credentials=credentials, tls=tls)
        self.groups: PerGroup[AsyncPushConsumer] = PerGroup(self._make, self._start, lambda c: c.shutdown())
        self.routes.on_change(self.groups.follow)

    def _make(self, g) -> AsyncPushConsumer:
        return AsyncPushConsumer(self.group, g.addresses, self.topic, self.listener, **self._kwargs)

    async def _start(self, c: AsyncPushConsumer) -> None:
        await topic_queue_count(c.client, self.topic)  # the group has the topic from now on
        await c.start()

    async def start(self) -> "AsyncClusterPushConsumer":
        await self.routes.start()
        return self

    @property
    def assigned(self) -> list[tuple[str, str, int]]:
        """(broker group, topic, queue id) of every queue this member consumes now."""
        return sorted((g, t, q) for g, c in self.groups.members.items() for t, q in c.assigned)

    @property
    def stats(self) -> ConsumerStats:
        out = ConsumerStats()
        for c in self.groups.members.values():
            out.queue_errors += c.stats.queue_errors
            out.send_back_errors += c.stats.send_back_errors
            out.skipped_by_retention += c.stats.skipped_by_retention
        return out

    def skipped_ranges(self) -> dict[str, list]:
        """Per broker group, its members' latest ranges of messages retention deleted before they
        were consumed: (topic, queue id, first offset, first offset after)."""
        return {g: list(c.stats.skipped_ranges) for g, c in self.groups.members.items() if c.stats.skipped_ranges}

    async def close(self) -> None:
        await self.routes.close()
        await self.groups.close()

    shutdown = close  # the push consumers' word

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.shutdown()


class ClusterPushConsumer(background.Blocking):
    """Blocking form of AsyncClusterPushConsumer: start(), shutdown(); the listener runs on thread pools."""

    def __init__(self, group: str, bootstrap, topic: str, listener, **kwargs):
        self._async = AsyncClusterPushConsumer(group, bootstrap, topic, listener, **kwargs)

    @property
    def assigned(self) -> list[tuple[str, str, int]]:
        return self._async.assigned

    @property
    def stats(self) -> ConsumerStats:
        return self._async.stats

    def refresh_route(self) -> bool:
        return background.run(self._async.routes.update())
