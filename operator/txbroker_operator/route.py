"""Pure: the cluster route a TxBroker's brokers and clients follow (the `<name>-route` ConfigMap,
mounted into every broker pod as `--cluster-file`), and its version.

The operator is the route's truth on Kubernetes: it renders it from the spec (how many groups, how
many brokers each) and from which groups are draining, and every broker serves what it holds to the
clients that bootstrap from it (broker_image/txbroker/protocol/cluster.py reads it). Which broker of
a group is master is not in the route (clients follow each group's epochs), so a failover changes
nothing here; addresses are the pods' stable DNS names, so a pod replaced on another IP does not
either. What does: a group added or removed, a group draining or active again, replicas changed.

`version` only rises: the brokers keep the route they hold when handed a lower one. The version in
force is kept in the TxBroker's status (routeVersion) as well as in the ConfigMap, and the next one
is above both, so neither a lost status write nor a ConfigMap edited or deleted by hand can take it
back down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from . import constants as c
from . import manifests

ACTIVE = "active"        # takes new messages
DRAINING = "draining"    # takes none; consumers finish what it holds (producers send elsewhere)


@dataclass(frozen=True)
class GroupRoute:
    name: str
    addresses: tuple[str, ...]
    state: str = ACTIVE


def group_route(broker: str, namespace: str, group: int, replicas: int, state: str) -> GroupRoute:
    """A group as the route lists it: every broker it should have, master and slaves alike."""
    return GroupRoute(manifests.group_name(group),
                      tuple(manifests.pod_address(broker, namespace, manifests.pod_name(broker, i, group))
                            for i in range(replicas)), state)


def body(broker: str, groups: list[GroupRoute]) -> dict[str, Any]:
    """The route without its version: what decides whether the version moves."""
    return {"cluster": broker,
            "groups": [{"name": g.name, "addresses": list(g.addresses), "state": g.state} for g in groups]}


def document(broker: str, version: int, groups: list[GroupRoute]) -> str:
    """route.yaml as the brokers read it."""
    doc = body(broker, groups)
    doc = {"cluster": doc["cluster"], "version": version, "groups": doc["groups"]}
    return (f"# The cluster route of TxBroker {broker}, written by the txbroker operator: edits are put back.\n"
            + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))


def parse(text: str | None) -> tuple[int, dict | None]:
    """(version, body) of a route.yaml; (0, None) for none or one that does not read as a route."""
    if not text:
        return 0, None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return 0, None
    if not isinstance(doc, dict) or not isinstance(doc.get("version"), int):
        return 0, None
    return doc["version"], {"cluster": doc.get("cluster"), "groups": doc.get("groups")}


def next_version(current_text: str | None, status_version: int, want: dict) -> int:
    """The version to write `want` (a body()) at: the ConfigMap's when it already holds exactly
    `want` at a version no lower than the status knows; otherwise one above anything either has held."""
    have_version, have = parse(current_text)
    known = max(have_version, int(status_version or 0))
    if have == want and have_version == known and known >= 1:
        return known
    return known + 1


def current(config_map: dict | None) -> str | None:
    """route.yaml in the ConfigMap as read from the API (None when absent)."""
    return ((config_map or {}).get("data") or {}).get(c.ROUTE_FILE)
