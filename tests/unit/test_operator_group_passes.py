"""Whole operator passes over a TxBroker of two broker groups, against an API server and brokers
held in memory (the operator's kube and admin-API calls swapped for these): both groups come up
with their route; one group's master is lost and only that group fails over; lowering spec.groups
drains a group, keeps it while it holds undelivered messages (a condition, an Event now and then),
removes it once drained, or at once when forced."""

from __future__ import annotations

import copy
import logging
import time

import pytest
import yaml
from txbroker.protocol import admin as answers
from txbroker_operator import broker_group, brokers, events, kube, reconcile
from txbroker_operator import constants as c
from txbroker_operator.brokers import BrokerInfo

NS, NAME = "shop", "orders"
LOG = logging.getLogger("test")


def _merge(target: dict, patch: dict) -> dict:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)
    return target


class World:
    """The API server's objects and the brokers behind the pods' IPs. A pod is Ready with an IP as
    soon as it is created, and its broker starts in the role its label says (the kubelet and the
    broker's start, in one step); a deleted pod is gone at once."""

    def __init__(self, spec: dict):
        self.objects: dict[tuple[str, str], dict] = {}
        self.events: list[dict] = []
        self.brokers: dict[str, dict] = {}     # ip -> role, epoch, offset, master
        self.drains: dict[str, dict] = {}       # ip -> GET /api/v1/drain answer
        self.routes_run: dict[str, int] = {}    # ip -> the route version it runs, if not the operator's last
        self.next_ip = 1
        self.objects[(c.TXBROKER_KIND, NAME)] = {
            "apiVersion": f"{c.GROUP}/{c.VERSION}", "kind": c.TXBROKER_KIND,
            "metadata": {"name": NAME, "namespace": NS, "uid": "uid-orders", "generation": 1, "annotations": {}},
            "spec": spec, "status": {}}

    # -- kube ------------------------------------------------------------------------------------

    def get(self, kind, ns, name):
        obj = self.objects.get((kind, name))
        return copy.deepcopy(obj) if obj is not None else None

    def create_if_absent(self, obj):
        if obj["kind"] == "Event":
            self.events.append(obj)
            return True
        key = (obj["kind"], obj["metadata"]["name"])
        if key in self.objects:
            return False
        obj = copy.deepcopy(obj)
        if obj["kind"] == "Pod":
            ip = f"10.1.0.{self.next_ip}"
            self.next_ip += 1
            obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}-{ip}"
            obj["status"] = {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
            role = obj["metadata"]["labels"][c.LABEL_ROLE]
            self.brokers[ip] = {"role": role, "epoch": 1, "offset": 100,
                                "master": obj["metadata"]["annotations"][c.ANNOTATION_MASTER]}
        self.objects[key] = obj
        return True

    def merge_patch(self, kind, ns, name, patch, subresource=""):
        obj = self.objects.get((kind, name))
        return _merge(obj, patch) if obj is not None else None

    def list_objects(self, kind, ns, labels=None):
        return [copy.deepcopy(o) for (k, _), o in self.objects.items() if k == kind and
                all((o["metadata"].get("labels") or {}).get(a) == b for a, b in (labels or {}).items())]

    def delete(self, kind, ns, name):
        obj = self.objects.pop((kind, name), None)
        if obj is not None and kind == "Pod":
            self.brokers.pop(obj["status"]["podIP"], None)
        return obj is not None

    def status(self) -> dict:
        return self.objects[(c.TXBROKER_KIND, NAME)]["status"]

    def txb(self) -> dict:
        return self.objects[(c.TXBROKER_KIND, NAME)]

    def pod_ip(self, name) -> str:
        return self.objects[("Pod", name)]["status"]["podIP"]

    def route(self) -> dict:
        return yaml.safe_load(self.objects[("ConfigMap", f"{NAME}-route")]["data"][c.ROUTE_FILE])

    def said(self, reason) -> list[str]:
        return [e["message"] for e in self.events if e["reason"] == reason]

    # -- the brokers' admin API ------------------------------------------------------------------

    def _broker(self, ip):
        if ip not in self.brokers:
            raise brokers.Unreachable(f"broker {ip}: connection refused")
        return self.brokers[ip]

    def info(self, ip):
        b = self._broker(ip)
        return BrokerInfo(role=b["role"], epoch=b["epoch"], log_end_offset=b["offset"], master=b["master"],
                          fenced_by=0, pending=0, parked=0, slaves=(), connected=b["role"] == "slave",
                          unconfirmed=b.get("unconfirmed", ""))

    def try_info(self, ip):
        try:
            return self.info(ip) if ip else None
        except brokers.Unreachable:
            return None

    def promote(self, ip, epoch, sync_set=None):
        self._broker(ip).update(role="master", epoch=epoch, master="")
        return self.info(ip)

    def confirm(self, ip, epoch, sync_set=None):
        b = self._broker(ip)
        assert b["role"] == "master" and b["epoch"] == epoch, f"confirmed {ip} at {epoch}, but it is {b}"
        b["unconfirmed"] = ""

    def demote(self, ip, master, epoch):
        # a broker's epoch is its log's: following a master changes it once that master's epoch
        # record arrives, not when it is told to follow
        self._broker(ip).update(role="slave", master=master, unconfirmed="")

    def put_transaction_defaults(self, ip, settings):
        self._broker(ip)

    def groups(self, ip):
        return {}

    def route_version(self, ip):
        self._broker(ip)   # the brokers have loaded the route the operator wrote, unless told otherwise
        return self.routes_run.get(ip, self.status().get("routeVersion", 0))

    def drain(self, ip):
        self._broker(ip)
        d = {"undelivered": 0, "topics": {}, "pending_transactions": 0, "drained": True, **self.drains.get(ip, {})}
        return answers.DrainStatus(group="g1", draining=True, **d)


@pytest.fixture
def world(monkeypatch):
    return install(World({"image": "txbroker/broker:1.0", "replicas": 2, "groups": 2, "replication": "ASYNC",
                          "failover": {"gracePeriodSeconds": 5}}), monkeypatch)


def install(w: World, monkeypatch) -> World:
    """The operator's Kubernetes and broker calls answered by `w`."""
    for fn in ("get", "create_if_absent", "merge_patch", "list_objects", "delete"):
        monkeypatch.setattr(kube, fn, getattr(w, fn))
    monkeypatch.setattr(kube, "list_pods", lambda ns, labels: w.list_objects("Pod", ns, labels))
    monkeypatch.setattr(kube, "delete_pod", lambda ns, name: w.delete("Pod", ns, name))
    monkeypatch.setattr(kube, "get_txbroker", lambda ns, name: w.get(c.TXBROKER_KIND, ns, name))
    monkeypatch.setattr(kube, "patch_txbroker_status",
                        lambda ns, name, st: _merge(w.status(), {k: v for k, v in st.items()}))
    monkeypatch.setattr(kube, "own_namespace", lambda: "txbroker-system")
    monkeypatch.setattr(reconcile.security, "access_for", lambda body: w)
    monkeypatch.setattr(events, "_last_posted", {})
    monkeypatch.setattr(events, "_last_at", {})
    return w


def passes(w: World, n: int = 4) -> dict:
    for _ in range(n):
        reconcile.sync(w.txb(), LOG)
    return w.status()


def test_two_groups_come_up_each_with_its_master_and_the_route_lists_both(world):
    st = passes(world)
    assert st["phase"] == "Running", st["conditions"]
    assert st["masters"] == "g0=orders-0,g1=orders-g1-0"
    assert [(g["name"], g["master"], g["state"], g["readyBrokers"]) for g in st["groups"]] == \
        [("g0", "orders-0", "active", 2), ("g1", "orders-g1-0", "active", 2)]
    assert st["master"] == "orders-0" and st["epoch"] == 1      # g0, where everything read it before groups
    r = world.route()
    assert r["version"] == st["routeVersion"] == 1
    assert [(g["name"], g["state"], len(g["addresses"])) for g in r["groups"]] == [("g0", "active", 2), ("g1", "active", 2)]
    # a slave of g1 follows g1's master, never g0's
    g1_slave = world.brokers[world.pod_ip("orders-g1-1")]
    assert g1_slave["role"] == "slave" and g1_slave["master"] == f"{world.pod_ip('orders-g1-0')}:10911"
    assert {k for k in world.objects if k[0] == "Service"} == {("Service", "orders"), ("Service", "orders-master")}
    assert world.get("PodDisruptionBudget", NS, NAME) is not None


def test_one_groups_master_lost_fails_over_that_group_only(world, monkeypatch):
    passes(world)
    g0_master_ip = world.pod_ip("orders-0")
    world.delete("Pod", NS, "orders-g1-0")          # g1's master: pod and broker gone (kill -9, node lost)
    passes(world, 1)
    assert world.status()["groups"][1].get("masterUnavailableSince")
    assert "masterUnavailableSince" not in world.status()     # the top-level field is g0's
    real = time.time
    monkeypatch.setattr(broker_group.time, "time", lambda: real() + 30)   # past the grace period
    st = passes(world, 3)
    g0, g1 = st["groups"]
    assert (g1["master"], g1["epoch"]) == ("orders-g1-1", 2)
    assert (g0["master"], g0["epoch"]) == ("orders-0", 1) and (st["master"], st["epoch"]) == ("orders-0", 1)
    assert world.brokers[g0_master_ip] == {"role": "master", "epoch": 1, "offset": 100, "master": ""}
    assert st["lastFailover"]["group"] == "g1" and st["lastFailover"]["to"] == "orders-g1-1"
    assert "lastFailover" not in g0 and g1["lastFailover"]["to"] == "orders-g1-1"
    (said,) = world.said("FailedOver")
    assert said.startswith("group g1: master orders-g1-0 down")
    assert st["masters"] == "g0=orders-0,g1=orders-g1-1"
    # the lost pod comes back as a slave of the new master; the route did not move (stable names)
    assert world.objects[("Pod", "orders-g1-0")]["metadata"]["labels"][c.LABEL_ROLE] == "slave"
    assert world.route()["version"] == 1


def test_a_restarted_master_is_confirmed_only_while_the_status_names_it(world, monkeypatch):
    passes(world)
    waits = "this master started again at epoch 1 and takes no write until its controller confirms it"
    g0_master = world.brokers[world.pod_ip("orders-0")]
    g0_master["unconfirmed"] = waits         # its container restarted; the status still names it
    passes(world, 1)
    assert g0_master == {"role": "master", "epoch": 1, "offset": 100, "master": ""} | {"unconfirmed": ""}
    # g1 fails over while its master is down; it comes back as master (its label read before the
    # relabel) and awaits a word: it is made to follow the new master, never confirmed
    ip = world.pod_ip("orders-g1-0")
    lost = world.brokers.pop(ip)
    passes(world, 1)
    real = time.time
    monkeypatch.setattr(broker_group.time, "time", lambda: real() + 30)   # past the grace period
    passes(world, 1)
    assert world.status()["groups"][1]["master"] == "orders-g1-1"
    world.brokers[ip] = {**lost, "unconfirmed": waits}
    passes(world, 1)
    assert world.brokers[ip]["role"] == "slave" and world.brokers[ip]["master"] == f"{world.pod_ip('orders-g1-1')}:10911"


def test_lowering_groups_drains_and_keeps_a_group_that_holds_undelivered_messages(world):
    passes(world)
    world.txb()["spec"]["groups"] = 1
    g1_master = world.pod_ip("orders-g1-0")
    world.drains[g1_master] = {"undelivered": 12, "topics": {"Orders": 12}, "pending_transactions": 0, "drained": False}
    st = passes(world, 5)
    r = world.route()
    assert r["version"] == 2 and [(g["name"], g["state"]) for g in r["groups"]] == [("g0", "active"), ("g1", "draining")]
    g1 = st["groups"][1]
    assert (g1["state"], g1["undelivered"], g1["drainRouteVersion"]) == ("draining", 12, 2)
    blocked = next(x for x in st["conditions"] if x["type"] == "ScaleDownBlocked")
    assert blocked["status"] == "True" and blocked["reason"] == "UndeliveredMessages" and "12 undelivered" in blocked["message"]
    assert len(world.said("ScaleDownBlocked")) == 1        # five passes, one Event
    assert ("Pod", "orders-g1-0") in world.objects and ("Pod", "orders-g1-1") in world.objects
    # consumers finish it: removed, and the route and status forget it
    world.drains[g1_master] = {"undelivered": 0, "pending_transactions": 0, "drained": True}
    st = passes(world, 3)
    assert [g["name"] for g in st["groups"]] == ["g0"] and st["masters"] == "g0=orders-0"
    assert not [k for k in world.objects if k[1].startswith("orders-g1")]
    assert [g["name"] for g in world.route()["groups"]] == ["g0"] and world.route()["version"] == 3
    assert world.said("GroupDrained") and world.said("GroupRemoved")
    assert next(x for x in st["conditions"] if x["type"] == "ScaleDownBlocked")["status"] == "False"
    assert st["phase"] == "Running"


def test_a_drained_group_stays_while_another_groups_participants_wait_on_it(world):
    passes(world)
    world.txb()["spec"]["groups"] = 1
    g0_master = world.pod_ip("orders-0")
    world.drains[g0_master] = {"waiting_on": {"g1": 2}}      # g0 holds 2 participants whose home is g1
    st = passes(world, 3)
    blocked = next(x for x in st["conditions"] if x["type"] == "ScaleDownBlocked")
    assert blocked["reason"] == "ParticipantsWaiting" and "2 on g0" in blocked["message"]
    assert ("Pod", "orders-g1-0") in world.objects
    world.drains[g0_master] = {"waiting_on": {}}               # they asked g1 and ended
    st = passes(world, 3)
    assert [g["name"] for g in st["groups"]] == ["g0"]


def test_a_drained_group_stays_until_every_other_master_runs_the_route_that_drains_it(world):
    """Until another group's master loads the route that drains g1, it takes new work that waits
    on g1's decision (a job's member, a participant) after any look at what waits: the fault
    harness, seed 19, had a member arrive after the look and wait forever on a removed group."""
    passes(world)
    world.txb()["spec"]["groups"] = 1
    g0_master = world.pod_ip("orders-0")
    world.routes_run[g0_master] = 1               # still the route from before the drain
    st = passes(world, 3)
    blocked = next(x for x in st["conditions"] if x["type"] == "ScaleDownBlocked")
    assert blocked["reason"] == "DrainUnknown" and "g0's master runs route version 1" in blocked["message"], blocked
    assert ("Pod", "orders-g1-0") in world.objects
    del world.routes_run[g0_master]               # it loaded the draining route
    st = passes(world, 3)
    assert [g["name"] for g in st["groups"]] == ["g0"]


def test_a_draining_group_whose_master_cannot_be_asked_is_kept(world):
    passes(world)
    world.txb()["spec"]["groups"] = 1
    world.brokers.pop(world.pod_ip("orders-g1-0"))     # its admin API stops answering
    st = passes(world, 2)
    blocked = next(x for x in st["conditions"] if x["type"] == "ScaleDownBlocked")
    assert blocked["reason"] == "DrainUnknown"
    assert ("Pod", "orders-g1-0") in world.objects


def test_force_removes_a_group_that_holds_messages_and_says_so(world):
    passes(world)
    world.txb()["spec"]["groups"] = 1
    world.drains[world.pod_ip("orders-g1-0")] = {"undelivered": 7, "topics": {"Orders": 7}, "drained": False}
    passes(world, 2)
    assert ("Pod", "orders-g1-0") in world.objects
    world.txb()["metadata"]["annotations"][c.ANNOTATION_FORCE_SCALE_DOWN] = "true"
    st = passes(world, 3)
    (forced,) = world.said("ForcedScaleDown")
    assert "7 undelivered message(s) (Orders: 7)" in forced and "lost" in forced
    assert [g["name"] for g in st["groups"]] == ["g0"]


def test_raising_groups_again_while_draining_makes_it_active_with_its_data(world):
    passes(world)
    uid = world.objects[("Pod", "orders-g1-0")]["metadata"]["uid"]
    world.txb()["spec"]["groups"] = 1
    world.drains[world.pod_ip("orders-g1-0")] = {"undelivered": 3, "drained": False}
    passes(world, 2)
    world.txb()["spec"]["groups"] = 2
    st = passes(world, 2)
    assert st["groups"][1]["state"] == "active" and "undelivered" not in st["groups"][1]
    assert world.objects[("Pod", "orders-g1-0")]["metadata"]["uid"] == uid      # same pod, same data
    assert [g["state"] for g in world.route()["groups"]] == ["active", "active"] and world.route()["version"] == 3


def test_a_txbroker_from_before_groups_is_group_0(world):
    """Pods without the group label and a status with only the top-level fields (an older operator)."""
    world.txb()["spec"]["groups"] = 1
    passes(world)
    for (kind, _), obj in world.objects.items():
        if kind == "Pod":
            del obj["metadata"]["labels"][c.LABEL_GROUP]
    for k in ("groups", "masters", "routeVersion"):
        world.status().pop(k)
    world.delete("ConfigMap", NS, f"{NAME}-route")
    st = passes(world, 2)
    assert [g["name"] for g in st["groups"]] == ["g0"] and st["master"] == "orders-0" and st["epoch"] == 1
    assert all(o["metadata"]["labels"][c.LABEL_GROUP] == "g0" for (k, _), o in world.objects.items() if k == "Pod")
    assert world.route()["version"] == st["routeVersion"] == 1
