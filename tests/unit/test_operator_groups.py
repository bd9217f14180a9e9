"""Broker groups on Kubernetes (issue 18), the operator's pure parts: what it builds per group, the
route it renders and how its version moves, which groups are in play, when a draining group may be
removed, and the status it writes (every field one the CRD keeps)."""

from __future__ import annotations

import pytest
import yaml
from txbroker.protocol.cluster import parse_route
from txbroker_operator import manifests, route, scaling, status
from txbroker_operator import constants as c
from txbroker_operator.brokers import BrokerInfo
from txbroker_operator.observe import Member
from txbroker_operator.scaling import DrainReport, Remove, Wait

from tests.conftest import REPO

SPEC = {"image": "txbroker/broker:1.0", "replicas": 2, "groups": 2}


# -- what is built per group ------------------------------------------------------------------

def test_group_0_keeps_the_names_of_a_single_group_and_the_others_say_their_group():
    assert [manifests.pod_name("orders", i) for i in range(2)] == ["orders-0", "orders-1"]
    assert [manifests.pod_name("orders", i, 1) for i in range(2)] == ["orders-g1-0", "orders-g1-1"]
    assert manifests.pvc_name("orders", 1, 3) == "data-orders-g3-1"
    assert manifests.pod_index("orders-g1-1") == 1
    assert manifests.group_name(12) == "g12" and manifests.group_index("g12") == 12
    assert manifests.group_index("x1") == -1 and manifests.group_index("g") == -1


def test_a_group_pod_carries_its_group_and_reads_the_mounted_route():
    p = manifests.broker_pod("orders", "shop", SPEC, 1, c.ROLE_SLAVE, "10.0.0.9:10911", group=1)
    assert p["metadata"]["name"] == "orders-g1-1"
    labels = p["metadata"]["labels"]
    assert labels[c.LABEL_GROUP] == "g1" and labels[c.LABEL_INDEX] == "1" and labels[c.LABEL_BROKER] == "orders"
    # every group's pods under the one headless Service: one certificate (*.orders.shop.svc) for all
    assert p["spec"]["hostname"] == "orders-g1-1" and p["spec"]["subdomain"] == "orders"
    args = p["spec"]["containers"][0]["args"]
    assert args[args.index("--group") + 1] == "g1"
    assert args[args.index("--cluster-file") + 1] == f"{c.ROUTE_DIR}/{c.ROUTE_FILE}"
    mount = next(m for m in p["spec"]["containers"][0]["volumeMounts"] if m["name"] == "route")
    assert mount == {"name": "route", "mountPath": c.ROUTE_DIR, "readOnly": True}   # whole: no subPath, so updates reach it
    volume = next(v for v in p["spec"]["volumes"] if v["name"] == "route")
    assert volume["configMap"]["name"] == "orders-route"
    g0 = manifests.broker_pod("orders", "shop", SPEC, 0, c.ROLE_MASTER)
    assert g0["metadata"]["name"] == "orders-0" and g0["metadata"]["labels"][c.LABEL_GROUP] == "g0"
    g0_args = g0["spec"]["containers"][0]["args"]
    assert g0_args[g0_args.index("--group") + 1] == "g0"


def test_group_claims():
    pvc = manifests.data_pvc("orders", "shop", {**SPEC, "storage": {"size": "1Gi"}}, 1, 2)
    assert pvc["metadata"]["name"] == "data-orders-g2-1" and pvc["metadata"]["labels"][c.LABEL_GROUP] == "g2"
    with_storage = manifests.broker_pod("orders", "shop", {**SPEC, "storage": {"size": "1Gi"}}, 1, c.ROLE_SLAVE, group=2)
    data = next(v for v in with_storage["spec"]["volumes"] if v["name"] == "data")
    assert data["persistentVolumeClaim"]["claimName"] == "data-orders-g2-1"
    assert manifests.group_selector_labels("orders", 2)[c.LABEL_GROUP] == "g2"


def test_the_bootstrap_service_selects_every_groups_master_and_nothing_else():
    selector = manifests.master_service("orders", "shop")["spec"]["selector"]
    assert selector[c.LABEL_ROLE] == c.ROLE_MASTER and c.LABEL_GROUP not in selector
    # the headless Service (pod DNS) selects every broker of every group
    assert c.LABEL_GROUP not in manifests.headless_service("orders", "shop")["spec"]["selector"]


def test_scaling_groups_or_replicas_rolls_no_pod():
    base = manifests.pod_spec_hash(SPEC)
    assert manifests.pod_spec_hash({**SPEC, "groups": 5}) == base
    assert manifests.pod_spec_hash({**SPEC, "replicas": 3}) == base


# -- the route --------------------------------------------------------------------------------

def groups_of(n, draining=(), replicas=2):
    return [route.group_route("orders", "shop", g, replicas, route.DRAINING if g in draining else route.ACTIVE)
            for g in range(n)]


def test_the_route_lists_every_broker_of_every_group_by_its_stable_name_and_the_broker_reads_it():
    doc = route.document("orders", 7, groups_of(2, draining=(1,)))
    parsed = parse_route(yaml.safe_load(doc))   # the brokers' own reader (protocol/cluster.py)
    assert parsed.cluster == "orders" and parsed.version == 7
    assert [(g.name, g.state) for g in parsed.groups] == [("g0", "active"), ("g1", "draining")]
    assert parsed.groups[0].addresses == ["orders-0.orders.shop.svc:10911", "orders-1.orders.shop.svc:10911"]
    assert parsed.groups[1].addresses == ["orders-g1-0.orders.shop.svc:10911", "orders-g1-1.orders.shop.svc:10911"]


def test_the_route_version_moves_only_on_a_change_and_never_down():
    two = route.body("orders", groups_of(2))
    first = route.next_version(None, 0, two)
    assert first == 1
    written = route.document("orders", first, groups_of(2))
    assert route.next_version(written, first, two) == 1                  # nothing changed: same version
    draining = route.body("orders", groups_of(2, draining=(1,)))
    assert route.next_version(written, first, draining) == 2             # a group drains
    assert route.next_version(written, first, route.body("orders", groups_of(2, replicas=3))) == 2   # replicas
    # the status knows a later version than the ConfigMap holds (edited back, or deleted): above both
    assert route.next_version(written, 9, two) == 10
    assert route.next_version(None, 9, two) == 10
    # the ConfigMap is ahead of the status (the operator stopped between the two writes): it holds
    # what is wanted, so its version stands (the status catches up); a change goes above it
    assert route.next_version(route.document("orders", 4, groups_of(2)), 3, two) == 4
    assert route.next_version(route.document("orders", 4, groups_of(2)), 3, draining) == 5
    assert route.next_version("not: [a route", 3, two) == 4


# -- which groups are in play -----------------------------------------------------------------

def test_plan_lowering_groups_drains_the_ones_past_it_and_raising_reactivates_them():
    assert scaling.plan(2, {}, set()) == {0: "active", 1: "active"}
    blocks = {"g0": {"state": "active"}, "g1": {"state": "active"}, "g2": {"state": "active"}}
    assert scaling.plan(1, blocks, {0, 1, 2}) == {0: "active", 1: "draining", 2: "draining"}
    assert scaling.plan(3, {**blocks, "g2": {"state": "draining"}}, {0, 1, 2})[2] == "active"
    # decided removal goes on whatever the spec says
    assert scaling.plan(3, {**blocks, "g2": {"state": "removing"}}, {0, 1})[2] == "removing"
    # pods of a group nobody recorded (a lost status) still count: never silently left behind
    assert scaling.plan(1, {}, {0, 3}) == {0: "active", 3: "draining"}
    assert scaling.wanted_groups({}) == 1 and scaling.wanted_groups({"groups": 99}) == c.MAX_GROUPS


def test_a_draining_group_goes_only_when_drained_at_a_route_that_drains_it():
    drained = DrainReport(undelivered=0, pending_transactions=0, drained=True, route_version=5)
    assert isinstance(scaling.decide_removal("g1", drained, "", 5, False), Remove)
    early = scaling.decide_removal("g1", DrainReport(0, 0, True, route_version=4), "", 5, False)
    assert isinstance(early, Wait) and early.reason == "RouteNotLoaded"
    held = scaling.decide_removal("g1", DrainReport(12, 0, False, 5, {"Orders": 9, "Billing": 3, "Idle": 0}), "", 5,
                                  False)
    assert isinstance(held, Wait) and held.reason == "UndeliveredMessages"
    assert "12 undelivered message(s) (Orders: 9, Billing: 3)" in held.message and c.ANNOTATION_FORCE_SCALE_DOWN in held.message
    pending = scaling.decide_removal("g1", DrainReport(0, 2, False, 5), "", 5, False)
    assert isinstance(pending, Wait) and pending.reason == "PendingTransactions" and "2 pending" in pending.message
    assert "a parked one waits for an operator: `txbroker tx list --state parked`" in pending.message  # what to do
    jobs = scaling.decide_removal("g1", DrainReport(0, 0, False, 5, undecided_jobs=1), "", 5, False)
    assert isinstance(jobs, Wait) and "0 pending transaction(s) and 1 undecided job(s)" in jobs.message, jobs
    unknown = scaling.decide_removal("g1", None, "its master g1-0 has no pod", 5, False)
    assert isinstance(unknown, Wait) and unknown.reason == "DrainUnknown" and "kept" in unknown.message


def test_a_drained_group_stays_while_transactions_elsewhere_wait_on_its_decision():
    drained = DrainReport(undelivered=0, pending_transactions=0, drained=True, route_version=5)
    waits = scaling.decide_removal("g1", drained, "", 5, False, {"g0": 3, "g2": 0})
    assert isinstance(waits, Wait) and waits.reason == "ParticipantsWaiting" and "3 on g0" in waits.message
    unknown = scaling.decide_removal("g1", drained, "", 5, False, None, "g0's master g-0 does not answer as master")
    assert isinstance(unknown, Wait) and unknown.reason == "DrainUnknown" and "g-0" in unknown.message
    assert isinstance(scaling.decide_removal("g1", drained, "", 5, False, {"g0": 0}), Remove)
    forced = scaling.decide_removal("g1", drained, "", 5, True, {"g0": 3})
    assert isinstance(forced, Remove) and "3 on g0" in forced.message


def test_force_removes_and_says_what_is_lost():
    forced = scaling.decide_removal("g1", DrainReport(12, 1, False, 5, {"Orders": 12}), "", 5, True)
    assert isinstance(forced, Remove) and forced.forced
    assert "12 undelivered message(s) (Orders: 12)" in forced.message and "lost" in forced.message
    blind = scaling.decide_removal("g1", None, "connection refused", 5, True)
    assert isinstance(blind, Remove) and "connection refused" in blind.message
    assert scaling.forced({c.ANNOTATION_FORCE_SCALE_DOWN: "true"}) and scaling.forced({c.ANNOTATION_FORCE_SCALE_DOWN: "True"})
    assert not scaling.forced({c.ANNOTATION_FORCE_SCALE_DOWN: "yes"}) and not scaling.forced(None)


# -- status -----------------------------------------------------------------------------------

def info(role, epoch=1, offset=100):
    return BrokerInfo(role=role, epoch=epoch, log_end_offset=offset, master="", fenced_by=0, pending=0, parked=0,
                      slaves=(), connected=role == "slave")


def member(name, index, group, role, epoch=1):
    pod = {"metadata": {"name": name, "uid": name, "labels": {c.LABEL_INDEX: str(index), c.LABEL_ROLE: role,
                                                            c.LABEL_GROUP: f"g{group}"},
                        "annotations": {c.ANNOTATION_POD_SPEC: manifests.pod_spec_hash(SPEC)}},
           "status": {"podIP": f"10.0.{group}.{index + 1}", "conditions": [{"type": "Ready", "status": "True"}]}}
    return Member(name, index, pod, info(role, epoch))


def two_groups(g1_master="orders-g1-0", g1_epoch=1):
    g0 = {"orders-0": member("orders-0", 0, 0, "master"), "orders-1": member("orders-1", 1, 0, "slave")}
    g1 = {n: member(n, i, 1, "master" if n == g1_master else "slave", g1_epoch)
          for i, n in enumerate(("orders-g1-0", "orders-g1-1"))}
    return g0, g1


def test_status_has_a_block_per_group_and_keeps_group_0_at_the_top():
    g0, g1 = two_groups("orders-g1-1", 2)
    failover = {"time": "2026-11-26T10:00:00Z", "from": "orders-g1-0", "to": "orders-g1-1", "epoch": 2, "message": "m"}
    body = {"metadata": {"name": "orders", "generation": 4}, "spec": SPEC, "status": {}}
    new = status.compute_groups(body, [status.GroupReport(0, g0, "orders-0", 1),
                                       status.GroupReport(1, g1, "orders-g1-1", 2, extra={"lastFailover": failover})],
                                {"routeVersion": 3})
    assert new["phase"] == "Running" and new["master"] == "orders-0" and new["epoch"] == 1
    assert new["masters"] == "g0=orders-0,g1=orders-g1-1" and new["routeVersion"] == 3
    assert [(b["name"], b["master"], b["epoch"], b["readyBrokers"], b["state"]) for b in new["groups"]] == \
        [("g0", "orders-0", 1, 2, "active"), ("g1", "orders-g1-1", 2, 2, "active")]
    assert new["groups"][1]["lastFailover"] == failover and "lastFailover" not in new["groups"][0]
    # the TxBroker's lastFailover is the latest of any group's (the failover alert reads it)
    assert new["lastFailover"] == {**failover, "group": "g1"}
    assert {b["group"] for b in new["brokers"]} == {"g0", "g1"} and len(new["brokers"]) == 4
    ready = next(x for x in new["conditions"] if x["type"] == "Ready")
    assert "g0: 2/2 brokers ready, master orders-0" in ready["message"] and "g1:" in ready["message"]


def test_one_group_writes_the_status_it_always_wrote():
    g0, _ = two_groups()
    body = {"metadata": {"name": "orders", "generation": 1}, "spec": {**SPEC, "groups": 1}, "status": {}}
    new = status.compute(body, g0, "orders-0", 1, {"masterUnavailableSince": None, "lastFailover": None})
    ready = next(x for x in new["conditions"] if x["type"] == "Ready")
    assert ready["message"] == "2/2 brokers ready; master orders-0"
    assert new["phase"] == "Running" and new["masters"] == "g0=orders-0"
    assert "ScaleDownBlocked" not in {x["type"] for x in new["conditions"]}


def test_a_group_past_the_count_drains_and_a_blocked_scale_down_is_a_condition():
    g0, g1 = two_groups()
    body = {"metadata": {"name": "orders", "generation": 2}, "spec": {**SPEC, "groups": 1}, "status": {}}
    new = status.compute_groups(
        body, [status.GroupReport(0, g0, "orders-0", 1),
               status.GroupReport(1, g1, "orders-g1-0", 1, "draining", {"undelivered": 12, "drainRouteVersion": 4})],
        {}, [("g1", "UndeliveredMessages", "g1 is draining and holds 12 undelivered message(s)")])
    assert new["groups"][1]["state"] == "draining" and new["groups"][1]["undelivered"] == 12
    assert new["phase"] == "Running" or new["phase"] == "Updating"
    blocked = next(x for x in new["conditions"] if x["type"] == "ScaleDownBlocked")
    assert blocked["status"] == "True" and blocked["reason"] == "UndeliveredMessages" and "12" in blocked["message"]
    progressing = next(x for x in new["conditions"] if x["type"] == "Progressing")
    assert progressing["status"] == "True" and "g1: draining" in progressing["message"]
    # once it is gone, the condition stays, False
    after = status.compute_groups({**body, "status": new}, [status.GroupReport(0, g0, "orders-0", 1)], {})
    cond = next(x for x in after["conditions"] if x["type"] == "ScaleDownBlocked")
    assert cond["status"] == "False"


def _unknown_fields(value, schema, path="status"):
    """Fields of `value` the structural schema would prune (the API server drops them silently,
    and the operator would then write them again on every pass)."""
    out = []
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        for k, v in value.items():
            if props is None:
                if "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
                    out += _unknown_fields(v, schema["additionalProperties"], f"{path}.{k}")
                continue
            if k not in props:
                out.append(f"{path}.{k}")
            else:
                out += _unknown_fields(v, props[k], f"{path}.{k}")
    elif isinstance(value, list) and schema.get("type") == "array":
        for i, v in enumerate(value):
            out += _unknown_fields(v, schema["items"], f"{path}[{i}]")
    return out


@pytest.mark.parametrize("groups", [1, 2])
def test_every_status_field_the_operator_writes_is_one_the_crd_keeps(groups):
    crd = yaml.safe_load((REPO / "crds" / "txbroker.yaml").read_text())
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    g0, g1 = two_groups("orders-g1-1", 2)
    last = {"time": "2026-11-26T10:00:00Z", "from": "a", "to": "b", "epoch": 2, "message": "m"}
    reports = [status.GroupReport(0, g0, "orders-0", 1, extra={"masterUnavailableSince": "2026-11-26T10:00:00Z"})]
    if groups == 2:
        reports.append(status.GroupReport(1, g1, "orders-g1-1", 2, "draining",
                                          {"lastFailover": last, "undelivered": 3, "undeliveredTopics": {"Orders": 3},
                                           "pendingTransactions": 0, "drainRouteVersion": 2}))
    body = {"metadata": {"name": "orders", "generation": 1}, "spec": SPEC, "status": {}}
    new = status.compute_groups(body, reports, {"routeVersion": 2}, [("g1", "UndeliveredMessages", "3")])
    new = {k: v for k, v in new.items() if v is not None}
    assert _unknown_fields(new, schema) == []
    allowed = set(schema["properties"]["conditions"]["items"]["properties"]["type"]["enum"])
    assert {x["type"] for x in new["conditions"]} <= allowed
    columns = {col["name"]: col["jsonPath"] for col in version["additionalPrinterColumns"]}
    assert columns["Groups"] == ".spec.groups" and columns["Masters"] == ".status.masters"


def test_the_crd_bounds_the_group_count():
    crd = yaml.safe_load((REPO / "crds" / "txbroker.yaml").read_text())
    groups = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["groups"]
    assert (groups["minimum"], groups["maximum"], groups["default"]) == (1, c.MAX_GROUPS, 1)


def test_the_txbrokers_last_failover_outlives_the_group_that_failed_over():
    g0, _ = two_groups()
    g1_failover = {"time": "2026-11-26T10:00:00Z", "from": "orders-g1-0", "to": "orders-g1-1", "epoch": 2,
                   "message": "m", "group": "g1"}
    body = {"metadata": {"name": "orders", "generation": 3}, "spec": {**SPEC, "groups": 1},
            "status": {"lastFailover": g1_failover, "groups": [{"name": "g0", "master": "orders-0", "epoch": 1}]}}
    new = status.compute_groups(body, [status.GroupReport(0, g0, "orders-0", 1)], {})
    assert new["lastFailover"] == g1_failover     # g1 is gone; the TxBroker still failed over then
    assert next(x for x in new["conditions"] if x["type"] == "FailedOver")["lastTransitionTime"] == g1_failover["time"]
    later = {"time": "2026-11-26T11:00:00Z", "from": "orders-0", "to": "orders-1", "epoch": 2, "message": "n"}
    newer = status.compute_groups(body, [status.GroupReport(0, g0, "orders-1", 2, extra={"lastFailover": later})], {})
    assert newer["lastFailover"] == {**later, "group": "g0"}
