"""One look at a TxBroker's pods and brokers: the facts every decision in a pass is made from."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping

from . import brokers, manifests
from . import constants as c
from .brokers import BrokerInfo


@dataclass
class Member:
    """A broker pod and, when its admin API answered, what its broker says."""
    name: str
    index: int
    pod: dict
    info: BrokerInfo | None
    refused: str = ""     # the admin API answered but refused the operator (credentials, TLS)
    incompatible: str = ""  # the admin API answered in a form the operator cannot read (version skew)

    @property
    def ip(self) -> str | None:
        return (self.pod.get("status") or {}).get("podIP")

    @property
    def address(self) -> str | None:
        return f"{self.ip}:{c.CLIENT_PORT}" if self.ip else None

    @property
    def ready(self) -> bool:
        conds = (self.pod.get("status") or {}).get("conditions") or []
        return any(x.get("type") == "Ready" and x.get("status") == "True" for x in conds)

    @property
    def deleting(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp"))

    @property
    def group(self) -> int:
        """Its broker group's index (pods made before broker groups carry no label: g0's)."""
        label = self.pod["metadata"].get("labels", {}).get(c.LABEL_GROUP)
        return 0 if label is None else manifests.group_index(label)

    @property
    def label_role(self) -> str:
        return self.pod["metadata"].get("labels", {}).get(c.LABEL_ROLE, c.ROLE_SLAVE)

    @property
    def master_annotation(self) -> str:
        return (self.pod["metadata"].get("annotations") or {}).get(c.ANNOTATION_MASTER, "")

    @property
    def spec_hash(self) -> str:
        return (self.pod["metadata"].get("annotations") or {}).get(c.ANNOTATION_POD_SPEC, "")

    @property
    def alive_master(self) -> bool:
        """Its broker answers and acts as master (not fenced)."""
        return self.info is not None and self.info.is_master


def observe(pods: list[dict], access: brokers.Access, ask_brokers: bool = True) -> dict[str, Member]:
    """The pods as members, each with what its broker says. The brokers are asked at once: a silent
    one (paused, partitioned) costs the pass one request timeout, not one per silent broker. A pod
    being deleted is asked too: its broker may serve on until it has handed over (a drain)."""
    members = {}
    for p in pods:
        idx = int(p["metadata"].get("labels", {}).get(c.LABEL_INDEX, 0))
        members[p["metadata"]["name"]] = Member(p["metadata"]["name"], idx, p, None)
    asked = [m for m in members.values() if ask_brokers and m.ip]
    if len(asked) > 1:
        with ThreadPoolExecutor(len(asked), thread_name_prefix="observe") as pool:
            list(pool.map(lambda m: _ask(m, access), asked))
    elif asked:
        _ask(asked[0], access)
    return members


def _ask(m: Member, access: brokers.Access) -> None:
    try:
        m.info = access.info(m.ip)
    except brokers.BrokerError as e:
        m.refused = str(e)
    except brokers.Incompatible as e:
        m.incompatible = str(e)
    except brokers.Unreachable:
        pass


def slave_sync(master: Member | None) -> dict[str, dict]:
    """The master's view of its followers, keyed by broker name (= pod name)."""
    if master is None or master.info is None or not master.info.is_master:
        return {}
    return {s.get("name", ""): s for s in master.info.slaves}


def acknowledging(master: Member | None) -> bool:
    """Whether this master can acknowledge writes now. A SYNC master with fewer slaves in sync than
    it needs acknowledges none (it answers SLAVE_NOT_AVAILABLE): its slaves still hold every write
    ever acknowledged, whatever it says of them at this moment."""
    if master is None or master.info is None or not master.info.is_master:
        return False
    return sum(1 for s in master.info.slaves if s.get("in_sync")) >= master.info.sync_replicas


def in_sync(master: Member | None, slave: Member) -> bool:
    """The master pushes every new write to this slave as it happens (its feed is live); under SYNC
    replication such a slave holds every acknowledged write."""
    s = slave_sync(master).get(slave.name)
    return bool(s and s.get("in_sync"))


def caught_up(master: Member | None, slave: Member) -> bool:
    """Safe to hand mastership to: in sync (fed live) when the master hands over gracefully (it
    waits for the slave to hold its exact end); from a master that cannot (before 0.2.0), in sync
    with nothing unacknowledged at this moment."""
    s = slave_sync(master).get(slave.name)
    if master is not None and master.info is not None and master.info.hands_over:
        return bool(s and s.get("in_sync"))
    return bool(s and s.get("in_sync") and s.get("lag", 1) == 0)


def highest_epoch(members: Mapping[str, Member], status: Mapping[str, Any]) -> int:
    seen = [m.info.epoch for m in members.values() if m.info] + [m.info.fenced_by for m in members.values() if m.info]
    return max([int(status.get("epoch") or 1)] + seen)
