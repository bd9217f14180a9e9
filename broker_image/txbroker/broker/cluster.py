"""This broker's place in a cluster of broker groups (protocol/cluster.py): its group, the route it
serves to clients, whether its group takes new messages, and connections to the other groups'
masters (a participant of a transaction that spans groups asks its home group how it ended).

The route comes from the cluster file and is read again when the file changes (a ConfigMap update
on Kubernetes). A file that does not parse, or holds an older version than the route in force, is
reported and the route in force kept.
"""

from __future__ import annotations

import asyncio
import logging

from txbroker.broker.replies import RequestError
from txbroker.protocol.cluster import ClusterRoute, RouteError, load_route_file
from txbroker.protocol.codes import ResponseCode

log = logging.getLogger(__name__)


class ClusterMembership:
    def __init__(self, group: str, cluster_file: str, credentials=None, tls=None):
        self.group = group
        self.cluster_file = cluster_file
        self.route: ClusterRoute | None = load_route_file(cluster_file) if cluster_file else None
        self.draining = self._draining()  # kept, not computed: every send looks at it
        self._credentials = credentials
        self._tls = tls
        self._peers: dict[str, tuple[tuple[str, ...], object]] = {}  # group -> (addresses, BrokerClient)

    @property
    def files(self) -> list[str]:
        return [self.cluster_file] if self.cluster_file else []

    def reload(self) -> bool:
        """Read the cluster file again; True if a newer route is now in force."""
        if not self.cluster_file:
            return False
        try:
            route = load_route_file(self.cluster_file)
        except RouteError as e:
            log.error("cluster route not reloaded, keeping version %d: %s", self.route.version if self.route else 0, e)
            return False
        current = self.route
        if current is not None and route.version < current.version:
            log.error("cluster file %s holds route version %d, older than version %d in force: kept %d",
                      self.cluster_file, route.version, current.version, current.version)
            return False
        if route.group(self.group) is None:
            log.error("cluster file %s (version %d) no longer lists group %r: kept version %d", self.cluster_file,
                      route.version, self.group, current.version if current else 0)
            return False
        if current is not None and route == current:
            return False
        self.route = route
        self.draining = self._draining()
        log.info("cluster route version %d: %s", route.version,
                 ", ".join(f"{g.name} ({g.state}, {len(g.addresses)} brokers)" for g in route.groups))
        return True

    def _draining(self) -> bool:
        me = self.route.group(self.group) if self.route is not None else None
        return me is not None and not me.active

    def refuse_draining(self) -> None:
        """New messages from producers, while the route drains this group."""
        raise RequestError(ResponseCode.SERVICE_NOT_AVAILABLE,
                           f"group {self.group} is draining (cluster route version {self.route.version}): it takes "
                           "no new messages; send to the cluster's active groups (refresh the route)")

    def check_home(self, home: str) -> None:
        """A participant's home: another group of this cluster."""
        self.check_other_group(home, "home")

    def refuse_if_home_leaving(self, home: str, what: str) -> None:
        """New work that waits on `home`'s decision (a participant, a job's member), while the route
        drains `home`: refused. The group may leave once nothing here waits on it, and what came
        after that look could never ask it how it ended."""
        g = self.route.group(home) if self.route is not None else None
        if g is not None and not g.active:
            raise RequestError(ResponseCode.SERVICE_NOT_AVAILABLE,
                               f"{what}: its home group {home} is draining (cluster route version "
                               f"{self.route.version}): nothing new may wait on its decision; start it on an "
                               "active group (refresh the route)")

    def check_other_group(self, name: str, role: str) -> None:
        """A group a spanning transaction names (its `role` there: home, participant): another group
        of this cluster."""
        if self.route is None:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                               f"{role} group {name[:64]!r}: this broker belongs to no cluster of broker groups "
                               "(no --cluster-file), so no transaction can span groups here")
        if name == self.group:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                               f"{role} group {name!r} is this broker's own group: a transaction spans other groups")
        if self.route.group(name) is None:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                               f"unknown {role} group {name[:64]!r}: cluster route version {self.route.version} has "
                               f"{', '.join(self.route.names)}")

    def peer(self, group: str):
        """A client following `group`'s master (None if the route does not list the group)."""
        from txbroker.client.connection import BrokerClient  # the client's master-following, reused

        g = self.route.group(group) if self.route is not None else None
        if g is None:
            return None
        addresses = tuple(g.addresses)
        known = self._peers.get(group)
        if known is not None and known[0] == addresses:
            return known[1]
        if known is not None:  # the group's brokers changed: a client for the new addresses
            asyncio.get_running_loop().create_task(known[1].close())
        client = BrokerClient(list(addresses), client_id=f"broker-{self.group}", request_timeout=5.0,
                              credentials=self._credentials, tls=self._tls)
        self._peers[group] = (addresses, client)
        return client

    async def close(self) -> None:
        for _addresses, client in self._peers.values():
            await client.close()
        self._peers.clear()
