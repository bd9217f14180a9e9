"""One client object per broker group, following the route: made for a group that appears, closed
for one that leaves. The producers and consumers of a cluster are built on it."""

from __future__ import annotations

import logging
from typing import Awaitable, Callable, Generic, TypeVar

from txbroker.protocol.cluster import ClusterRoute, GroupRoute

log = logging.getLogger(__name__)

T = TypeVar("T")


class PerGroup(Generic[T]):
    def __init__(self, make: Callable[[GroupRoute], Awaitable[T]], close: Callable[[T], Awaitable[None]]):
        self._make = make
        self._close = close
        self.members: dict[str, T] = {}
        self._addresses: dict[str, list[str]] = {}
        self.active: list[str] = []  # groups taking new messages, in route order

    async def follow(self, route: ClusterRoute) -> None:
        for g in route.groups:
            if g.name in self.members and self._addresses[g.name] == g.addresses:
                continue
            old = self.members.pop(g.name, None)
            if old is not None:  # the group's brokers changed: a client for the new addresses
                await self._close(old)
            self.members[g.name] = await self._make(g)
            self._addresses[g.name] = list(g.addresses)
        for name in [n for n in self.members if route.group(n) is None]:
            log.info("broker group %s left the cluster route (version %d)", name, route.version)
            self._addresses.pop(name, None)
            await self._close(self.members.pop(name))
        self.active = [g.name for g in route.groups if g.active]

    async def close(self) -> None:
        for name in list(self.members):
            await self._close(self.members.pop(name))
