"""One client object per broker group, following the route: made for a group that appears, closed
for one that leaves. The producers and consumers of a cluster are built on it.

A group whose client cannot start (no master reachable during its failover, a new group whose
slave is not in sync yet) is left out, closed so that it holds no registration, and tried again at
the next route refresh; the other groups are used meanwhile."""

from __future__ import annotations

import logging
from typing import Awaitable, Callable, Generic, TypeVar

from txbroker.client.errors import ClientError
from txbroker.client.log_limit import RepeatedWarnings
from txbroker.protocol.cluster import ClusterRoute, GroupRoute

log = logging.getLogger(__name__)
_warnings = RepeatedWarnings(log)

T = TypeVar("T")


class PerGroup(Generic[T]):
    def __init__(self, make: Callable[[GroupRoute], T], start: Callable[[T], Awaitable[object]],
                 close: Callable[[T], Awaitable[None]]):
        self._make = make
        self._start = start
        self._close = close
        self.members: dict[str, T] = {}
        self._addresses: dict[str, list[str]] = {}
        self.active: list[str] = []  # groups taking new messages (with a client), in route order

    async def follow(self, route: ClusterRoute) -> bool:
        """Clients for the route's groups; True when every group has one. Raises only when no
        group's client could start."""
        missing: list[str] = []
        error: ClientError | None = None
        for g in route.groups:
            if g.name in self.members and self._addresses[g.name] == g.addresses:
                continue
            old = self.members.pop(g.name, None)
            if old is not None:  # the group's brokers changed: a client for the new addresses
                await self._close(old)
            client = self._make(g)
            try:
                await self._start(client)
            except ClientError as e:
                await self._close(client)
                missing.append(g.name)
                error = e
                _warnings.warning("group client not started", "broker group %s left out for now (tried again at "
                                  "the next route refresh): %s", g.name, e)
                continue
            self.members[g.name] = client
            self._addresses[g.name] = list(g.addresses)
        for name in [n for n in self.members if route.group(n) is None]:
            log.info("broker group %s left the cluster route (version %d)", name, route.version)
            self._addresses.pop(name, None)
            await self._close(self.members.pop(name))
        self.active = [g.name for g in route.groups if g.active and g.name in self.members]
        if not self.members and error is not None:
            raise error
        return not missing

    async def close(self) -> None:
        for name in list(self.members):
            await self._close(self.members.pop(name))
