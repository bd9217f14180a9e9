"""A cluster of broker groups: the route every client and broker follows.

A broker group is a master and its slaves (one epoch sequence, one failover); a topic has queues on
every group, and a queue is named by (group, queue id). The route lists the groups, each with the
addresses of all its brokers and whether it takes new writes (`active`) or is being emptied
(`draining`). Which broker of a group leads is not in the route: clients find it as they always did
(HEARTBEAT answers role and epoch, the highest epoch wins), so a failover inside a group needs no
route change.

The route's truth is a file (`txbroker broker --cluster-file`): written by hand for a cluster on one
machine, rendered by the operator into a ConfigMap on Kubernetes. Every broker serves the route it
holds (GET_CLUSTER_ROUTE), so a client bootstraps from any broker address. `version` only rises: a
broker keeps the route it holds when handed an older one, and a client keeps the newest it has seen.
"""

from __future__ import annotations

import re

import msgspec
from msgspec import Struct

ACTIVE = "active"
DRAINING = "draining"
GROUP_STATES = (ACTIVE, DRAINING)
GROUP_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")  # fullmatch: a DNS label part (pod names carry it)
GROUP_NAME_RULE = "1-32 of a-z 0-9 -, starting and ending with a letter or digit"
MAX_GROUPS = 16


class RouteError(ValueError):
    """A route that cannot be used; the message names what is wrong and where."""


class GroupRoute(Struct, array_like=True, omit_defaults=True):
    name: str
    addresses: list[str]
    state: str = ACTIVE

    @property
    def active(self) -> bool:
        return self.state == ACTIVE


class ClusterRoute(Struct, array_like=True, omit_defaults=True):
    cluster: str
    version: int
    groups: list[GroupRoute]

    def group(self, name: str) -> GroupRoute | None:
        return next((g for g in self.groups if g.name == name), None)

    @property
    def names(self) -> list[str]:
        return [g.name for g in self.groups]

    def as_dict(self) -> dict:
        return {"cluster": self.cluster, "version": self.version,
                "groups": [{"name": g.name, "addresses": list(g.addresses), "state": g.state} for g in self.groups]}


class ClusterRouteRequest(Struct, array_like=True):
    pass


class ClusterRouteResponse(Struct, array_like=True, omit_defaults=True):
    group: str  # the answering broker's group ("" on a broker outside any cluster)
    route: ClusterRoute | None = None  # None: a single group, the one the client asked


class _GroupDoc(Struct, forbid_unknown_fields=True):
    name: str
    addresses: list[str]
    state: str = ACTIVE


class _RouteDoc(Struct, forbid_unknown_fields=True):
    cluster: str
    version: int
    groups: list[_GroupDoc]


def check_group_name(name: str, what: str = "group name") -> str:
    if not GROUP_NAME.fullmatch(name or ""):
        raise RouteError(f"{what} {name[:64]!r} is not allowed: {GROUP_NAME_RULE}")
    return name


def parse_route(data: dict, where: str = "the route") -> ClusterRoute:
    """A route from its document (a dict from YAML or JSON), checked: RouteError names the field."""
    try:
        doc = msgspec.convert(data, _RouteDoc)
    except msgspec.ValidationError as e:
        raise RouteError(f"{where}: {e}") from None
    if doc.version < 1:
        raise RouteError(f"{where}: version {doc.version}: must be 1 or more (raise it on every change)")
    if not doc.groups:
        raise RouteError(f"{where}: groups: a cluster needs at least one group")
    if len(doc.groups) > MAX_GROUPS:
        raise RouteError(f"{where}: groups: {len(doc.groups)} groups; at most {MAX_GROUPS}")
    seen: set[str] = set()
    groups = []
    for i, g in enumerate(doc.groups):
        check_group_name(g.name, f"{where}: groups[{i}].name")
        if g.name in seen:
            raise RouteError(f"{where}: groups[{i}].name {g.name!r} appears twice")
        seen.add(g.name)
        if g.state not in GROUP_STATES:
            raise RouteError(f"{where}: groups[{i}].state {g.state!r}: one of {', '.join(GROUP_STATES)}")
        if not g.addresses:
            raise RouteError(f"{where}: groups[{i}].addresses: group {g.name!r} lists no broker")
        for a in g.addresses:
            host, sep, port = a.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise RouteError(f"{where}: groups[{i}].addresses: {a!r} is not host:port")
        groups.append(GroupRoute(g.name, list(g.addresses), g.state))
    if not any(g.active for g in groups):
        raise RouteError(f"{where}: every group is draining: new writes would have nowhere to go")
    return ClusterRoute(doc.cluster, doc.version, groups)


def load_route_file(path: str) -> ClusterRoute:
    """The route in a YAML (or JSON) file."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise RouteError(f"cluster file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise RouteError(f"cluster file {path}: not YAML: {e}") from None
    if not isinstance(data, dict):
        raise RouteError(f"cluster file {path}: expected a mapping with cluster, version and groups")
    return parse_route(data, f"cluster file {path}")
