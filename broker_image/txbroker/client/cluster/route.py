"""The cluster's route as a client knows it: fetched from any bootstrap broker, refreshed in the
background, the newest version kept. A broker outside any cluster answers no route: the client then
sees one group, the bootstrap addresses (every producer and consumer works with a single group too)."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from txbroker.client.connection import BrokerClient, parse_brokers
from txbroker.client.errors import ClientError
from txbroker.client.log_limit import RepeatedWarnings
from txbroker.protocol.cluster import ClusterRoute, ClusterRouteRequest, ClusterRouteResponse, GroupRoute
from txbroker.protocol.codes import RequestCode

log = logging.getLogger(__name__)
_warnings = RepeatedWarnings(log)

SINGLE = "default"  # the one group's name when the bootstrap broker belongs to no cluster


class RouteBook:
    def __init__(self, bootstrap, *, refresh: float = 10.0, request_timeout: float = 10.0, credentials=None, tls=None):
        self.bootstrap = parse_brokers(bootstrap)
        self.refresh = refresh
        self.route: ClusterRoute | None = None
        self._client = BrokerClient(self.bootstrap, require_master=False, request_timeout=request_timeout,
                                    credentials=credentials, tls=tls)
        self._listeners: list[Callable[[ClusterRoute], Awaitable[bool]]] = []
        self._followed = False  # every listener followed the route held (else: again at the next refresh)
        self._task: asyncio.Task | None = None

    async def start(self) -> ClusterRoute:
        await self.update()
        self._task = asyncio.ensure_future(self._run())
        return self.route

    def on_change(self, listener: Callable[[ClusterRoute], Awaitable[bool]]) -> None:
        """`listener(route)` follows a new route; it answers False when it followed it only in part."""
        self._listeners.append(listener)

    async def fetch(self) -> ClusterRoute:
        r: ClusterRouteResponse = await self._client.request(
            RequestCode.GET_BROKER_CLUSTER_INFO, ClusterRouteRequest(), ClusterRouteResponse)
        if r.route is None:
            return ClusterRoute("", 0, [GroupRoute(r.group or SINGLE, list(self.bootstrap))])
        return r.route

    async def update(self) -> bool:
        """Fetch the route; True if the listeners followed it now: it is newer than the one held, or
        the same one, which they had followed only in part."""
        route = await self.fetch()
        current = self.route
        if current is not None and (route.version < current.version or route == current and self._followed):
            return False  # never back to an older route; the one held, only if not yet fully followed
        self.route = route
        followed = True
        for listener in self._listeners:  # a part not followed (a group's client not started) is
            followed = await listener(route) is not False and followed  # tried again at the next refresh
        self._followed = followed
        if current is not None and route != current:
            log.info("cluster route version %d: %s", route.version,
                     ", ".join(f"{g.name} ({g.state})" for g in route.groups))
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh)
            try:
                await self.update()
            except ClientError as e:
                _warnings.warning("route refresh failed", "cluster route not refreshed: %s", e)
            except Exception:  # noqa: BLE001 - a listener failing must not end the refreshing
                log.exception("following cluster route version %d failed", self.route.version if self.route else 0)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self._client.close()
