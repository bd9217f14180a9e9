"""Plain producers of a cluster of broker groups: one AsyncProducer per group, messages placed by
placement.py."""

from __future__ import annotations

from txbroker.client import background
from txbroker.client.cluster.members import PerGroup
from txbroker.client.cluster.placement import Placement
from txbroker.client.cluster.route import RouteBook
from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.producer import AsyncProducer, SendResult, as_list, topic_queue_count
from txbroker.protocol.codes import ResponseCode


class ClusterSender:
    """What a cluster's producers share: the route, one single-group producer per group (made by
    `_make`), and where each send's messages go."""

    def __init__(self, bootstrap, *, route_refresh: float, request_timeout: float, credentials, tls):
        self.routes = RouteBook(bootstrap, refresh=route_refresh, request_timeout=request_timeout,
                                credentials=credentials, tls=tls)
        self.placement = Placement()
        self.groups = PerGroup(self._make, lambda p: p.start(), lambda p: p.close())
        self.routes.on_change(self._follow)

    def _make(self, g):
        raise NotImplementedError

    async def _follow(self, route) -> bool:
        self.placement.forget()
        return await self.groups.follow(route)

    async def start(self):
        await self.routes.start()
        return self

    async def _count(self, group: str, topic: str) -> int:
        return await topic_queue_count(self.groups.members[group].client, topic)

    async def close(self) -> None:
        await self.groups.close()
        await self.routes.close()

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()


class AsyncClusterProducer(ClusterSender):
    """Sends to the groups of the cluster that `bootstrap` (any broker of it) belongs to."""

    def __init__(self, group: str, bootstrap, *, request_timeout: float = 10.0, route_refresh: float = 10.0,
                 credentials=None, tls=None):
        self.group = group
        self._kwargs = dict(request_timeout=request_timeout, credentials=credentials, tls=tls)
        super().__init__(bootstrap, route_refresh=route_refresh, **self._kwargs)

    def _make(self, g) -> AsyncProducer:
        return AsyncProducer(self.group, g.addresses, **self._kwargs)

    async def send(self, msg_or_msgs, selector=None, arg=None) -> SendResult:
        """As AsyncProducer.send; `selector(queue_count, message, arg)` chooses among the topic's queues
        on every active group. Messages that land on several groups are sent to each (not atomically:
        use a transaction for that); the result lists each message's group in `groups`. A part a
        draining group refused (nothing of it stored) is placed again on the route read anew."""
        out = SendResult([])
        todo = as_list(msg_or_msgs)
        for last_try in (False, True):
            refused: list = []
            parts = await self.placement.place(todo, self.groups.active, self._count, selector, arg)
            for group, part in parts.items():
                try:
                    r = await self.groups.members[group].send(part)
                except BrokerError as e:
                    if e.code == ResponseCode.SERVICE_NOT_AVAILABLE and not last_try:
                        refused += part
                        continue
                    self.placement.avoid(group)
                    raise
                except ClientError:
                    self.placement.avoid(group)
                    raise
                out.msg_ids += r.msg_ids
                out.queue_ids += r.queue_ids
                out.queue_offsets += r.queue_offsets
                out.groups += [group] * len(part)
            if not refused:
                break
            await self.routes.update()
            todo = refused
        return out


class ClusterProducer(background.Blocking):
    """Blocking form of AsyncClusterProducer."""

    def __init__(self, group: str, bootstrap, **kwargs):
        self._async = AsyncClusterProducer(group, bootstrap, **kwargs)

    @property
    def route(self):
        return self._async.routes.route

    def send(self, msg_or_msgs, selector=None, arg=None) -> SendResult:
        return background.run(self._async.send(msg_or_msgs, selector, arg))

    def refresh_route(self) -> bool:
        """Read the route now (it is read every `route_refresh` seconds anyway); True if it changed."""
        return background.run(self._async.routes.update())
