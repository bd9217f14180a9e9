"""Planned switchovers in whole operator passes (issue 32, item 2), against an API server and
brokers held in memory (test_operator_group_passes.World): a rolling update, the annotation
txbroker.dev/switchover and a master pod being deleted (a drain's eviction) each move mastership
through the old master's handover (POST /api/v1/handover) before the new master is promoted; a
handover that cannot finish leaves the old master in charge; a broker from before 0.2.0 is fenced
first; each group has its PodDisruptionBudget."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from txbroker_operator import brokers, reconcile
from txbroker_operator import constants as c
from txbroker_operator.brokers import BrokerInfo

from test_operator_group_passes import LOG, NAME, NS, World, install

ADDR = "{}:10911"


class Brokers(World):
    """World's brokers, as a 0.2.0 master reports its slaves (in sync) and hands over."""

    def __init__(self, spec):
        super().__init__(spec)
        self.handovers: list[tuple[str, str, int]] = []   # (from pod, to pod, epoch)
        self.stuck: set[str] = set()      # pods whose handover is abandoned (the successor does not catch up)
        self.old: set[str] = set()        # pods running a broker before 0.2.0 (no handover)

    def name_of(self, ip):
        return next(n for (k, n), o in self.objects.items() if k == "Pod" and o["status"]["podIP"] == ip)

    def info(self, ip):
        b = self._broker(ip)
        slaves = tuple({"name": self.name_of(i), "in_sync": True, "lag": 0} for i, s in self.brokers.items()
                       if s["role"] == "slave" and s["master"] == ADDR.format(ip)) if b["role"] == "master" else ()
        return BrokerInfo(role=b["role"], epoch=b["epoch"], log_end_offset=b["offset"], master=b["master"],
                          fenced_by=0, pending=0, parked=0, slaves=slaves, connected=b["role"] == "slave",
                          store_format=0 if self.name_of(ip) in self.old else 5)

    def handover(self, ip, successor, epoch, timeout_ms):
        name = self.name_of(ip)
        if name in self.old:
            raise brokers.NoHandover(f"broker {ip} has no POST /api/v1/handover (a broker before 0.2.0)")
        b = self._broker(ip)
        if b["role"] != "master":
            raise brokers.BrokerError(ip, 409, {"error": "only a master taking writes hands over"})
        self.handovers.append((name, successor, epoch))
        if name in self.stuck:
            raise brokers.BrokerError(ip, 503, {"error": f"handover to {successor} abandoned: it acknowledged up to "
                                                         "LSN 90 of 100 within 5.0s; this broker takes writes again"})
        b.update(role="slave", master=ADDR.format(self.pod_ip(successor)))
        return SimpleNamespace(offset=b["offset"])

    def annotate(self, value):
        self.objects[(c.TXBROKER_KIND, NAME)]["metadata"]["annotations"][c.ANNOTATION_SWITCHOVER] = value

    def annotation(self):
        return self.objects[(c.TXBROKER_KIND, NAME)]["metadata"]["annotations"].get(c.ANNOTATION_SWITCHOVER)

    def evict(self, pod):
        """A drain's eviction: the pod is being deleted, its broker serves on (waiting for a handover)."""
        self.objects[("Pod", pod)]["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"

    def master_pods(self):
        return sorted(n for (k, n), o in self.objects.items()
                      if k == "Pod" and o["metadata"]["labels"][c.LABEL_ROLE] == "master")


@pytest.fixture
def world(monkeypatch):
    w = install(Brokers({"image": "txbroker/broker:1.0", "replicas": 3, "replication": "SYNC",
                         "failover": {"gracePeriodSeconds": 5}}), monkeypatch)
    for _ in range(4):
        reconcile.sync(w.txb(), LOG)
    assert w.status()["phase"] == "Running" and w.status()["master"] == f"{NAME}-0"
    return w


def passes(w, n=1) -> dict:
    for _ in range(n):
        reconcile.sync(w.txb(), LOG)
    return w.status()


def master_broker(w) -> str:
    (name,) = [w.name_of(ip) for ip, b in w.brokers.items() if b["role"] == "master"]
    return name


def test_a_rolling_update_hands_over_before_the_new_master_is_promoted(world):
    world.objects[(c.TXBROKER_KIND, NAME)]["spec"]["image"] = "txbroker/broker:2.0"
    st = passes(world, 12)
    assert st["phase"] == "Running", st["conditions"]
    new = st["master"]
    assert world.handovers == [(f"{NAME}-0", new, 2)], world.handovers
    assert master_broker(world) == new and world.master_pods() == [new] and st["epoch"] == 2
    (block,) = st["groups"]
    assert "switchover" not in block and block["lastSwitchover"]["from"] == f"{NAME}-0"
    assert block["lastSwitchover"]["to"] == new and "lastFailover" not in st
    assert any("is to be replaced: master moves" in m for m in world.said("Switchover"))


def test_the_annotation_moves_a_group_to_the_pod_named_and_is_removed(world):
    world.annotate(f"{NAME}-2")
    st = passes(world)
    assert world.handovers == [(f"{NAME}-0", f"{NAME}-2", 2)]
    assert st["master"] == master_broker(world) == f"{NAME}-2" and world.master_pods() == [f"{NAME}-2"]
    assert world.annotation() is None
    world.annotate("g0")   # a group: its most caught-up slave
    st = passes(world)
    assert world.handovers[-1][0] == f"{NAME}-2" and st["master"] in (f"{NAME}-0", f"{NAME}-1")
    assert master_broker(world) == st["master"] and world.annotation() is None and st["epoch"] == 3


def test_an_annotation_naming_nothing_of_this_txbroker_is_refused_and_removed(world):
    world.annotate("g7, nobody")
    passes(world)
    said = world.said("SwitchoverRefused")
    assert any("'g7' is neither a broker group (g0) nor a broker pod of this TxBroker" in m for m in said), said
    assert world.annotation() is None and world.handovers == [] and world.status()["master"] == f"{NAME}-0"


def test_a_handover_that_cannot_finish_leaves_the_old_master_in_charge(world):
    world.stuck.add(f"{NAME}-0")
    world.annotate(f"{NAME}-1")
    st = passes(world)
    assert world.handovers == [(f"{NAME}-0", f"{NAME}-1", 2)]
    assert st["master"] == master_broker(world) == f"{NAME}-0" and world.master_pods() == [f"{NAME}-0"]
    (said,) = world.said("SwitchoverFailed")
    assert f"switchover from {NAME}-0 to {NAME}-1 abandoned, {NAME}-0 stays master" in said and "acknowledged up to" in said
    assert "switchover" not in st["groups"][0] and world.annotation() is None
    assert world.brokers[world.pod_ip(f"{NAME}-1")]["role"] == "slave"


def test_a_master_pod_being_deleted_is_switched_over_at_once_not_failed_over(world):
    world.evict(f"{NAME}-0")
    st = passes(world)
    new = st["master"]
    assert new != f"{NAME}-0" and world.handovers == [(f"{NAME}-0", new, 2)]
    assert master_broker(world) == new and "masterUnavailableSince" not in st and "lastFailover" not in st


def test_a_master_before_0_2_0_is_fenced_first(world):
    world.old.add(f"{NAME}-0")
    world.brokers[world.pod_ip(f"{NAME}-0")]["offset"] = 100
    world.annotate(f"{NAME}-1")
    st = passes(world)
    assert st["master"] == master_broker(world) == f"{NAME}-1"
    assert any(f"{NAME}-0 cannot hand over" in m and "fenced before" in m for m in world.said("Switchover"))


def test_each_group_has_its_disruption_budget_and_a_lone_broker_none(world):
    pdb = world.get("PodDisruptionBudget", NS, NAME)
    assert pdb["spec"]["minAvailable"] == 2   # of 3: one away at a time
    assert pdb["spec"]["selector"]["matchLabels"][c.LABEL_GROUP] == "g0"
    world.objects[(c.TXBROKER_KIND, NAME)]["spec"].update(groups=2)
    passes(world, 3)
    assert world.get("PodDisruptionBudget", NS, f"{NAME}-g1")["spec"]["selector"]["matchLabels"][c.LABEL_GROUP] == "g1"
    world.objects[(c.TXBROKER_KIND, NAME)]["spec"].update(groups=1, replicas=1)
    passes(world, 6)
    assert world.get("PodDisruptionBudget", NS, NAME) is None
