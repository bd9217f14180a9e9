"""A TxBroker of several broker groups on the real node (issue 18): each group gets its master, the
route ConfigMap lists every group and reaches the brokers, clients in pods bootstrap from the one
`<name>-master` Service and use both groups; one group's master is killed and only that group
fails over; lowering spec.groups drains a group, which is kept while it holds undelivered messages
and removed once a consumer has taken them. The schema refuses a group count out of range.
How the operator runs: tests/e2e/operator_env.py; the operator's side: operator/README.md.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from cluster import BROKER_IMAGE
from operator_env import admin, broker_info, condition, events_for, finished, ready, service_endpoints, start_operator, txbroker
from support import txload
from support.waiting import wait_until

pytestmark = pytest.mark.e2e

WORKLOADS = Path(__file__).resolve().parent / "workloads"


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-groups-{worker_id}")


def client_pod(name: str, *args: str) -> dict:
    """A pod of the broker image running workloads/cluster_clients.py ARGS (mounted from a ConfigMap)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "orders"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": BROKER_IMAGE,
                                     "command": ["python", "/workloads/cluster_clients.py", *args],
                                     "volumeMounts": [{"name": "workloads", "mountPath": "/workloads"}]}],
                     "volumes": [{"name": "workloads", "configMap": {"name": "cluster-clients"}}]}}


def run_client(tb, namespace: str, name: str, *args: str, timeout: float = 240) -> list[str]:
    """Run a client pod to its end; its output lines."""
    tb.apply(client_pod(name, *args), namespace)
    p = wait_until(lambda: finished(tb, namespace, name), timeout, f"client pod {name} to finish")
    out = tb.logs(name, namespace)
    assert p["status"]["phase"] == "Succeeded", out[-3000:]
    return out.splitlines()


def group_block(txb: dict, group: str) -> dict:
    return next((g for g in (txb.get("status") or {}).get("groups") or [] if g["name"] == group), {})


def route_of(tb, namespace: str, name: str) -> dict:
    return yaml.safe_load(tb.get("configmap", f"{name}-route", namespace)["data"]["route.yaml"])


def pod_ip(tb, namespace: str, pod: str) -> str:
    return tb.get("pod", pod, namespace)["status"]["podIP"]


@pytest.mark.slow
@pytest.mark.timeout(900)   # four brokers up, a failover, a drain and a removal, one after the other
def test_two_groups_fail_over_alone_and_drain_before_removal(operator):
    tb, namespace, name = operator.testbed, operator.namespace, "duo"
    tb.apply(txbroker(name, replicas=2, groups=2, replication="SYNC", flush="SYNC",
                      failover={"gracePeriodSeconds": 3}), namespace)
    pods = ["duo-0", "duo-1", "duo-g1-0", "duo-g1-1"]

    # -- both groups up, each with its master ----------------------------------------------------
    def running():
        assert not (down := operator.exited()), down
        t = tb.get("txb", name, namespace)
        return t if (t.get("status") or {}).get("phase") == "Running" else None
    try:
        txb = wait_until(running, 240, "TxBroker duo Running with two groups")
    except TimeoutError:
        raise AssertionError("duo not Running:\n" + tb.kubectl("-n", namespace, "get", "pods,txb", "-o", "wide").stdout
                             + json.dumps((tb.get("txb", name, namespace) or {}).get("status"), indent=1)[-3000:]
                             + "".join(f"\n--- {p}:\n" + tb.pod_log(p, namespace)[-1500:] for p in pods)
                             + "\noperator log:\n" + operator.log.read_text()[-4000:]) from None
    st = txb["status"]
    assert st["masters"] == "g0=duo-0,g1=duo-g1-0"
    assert [(g["name"], g["master"], g["epoch"], g["readyBrokers"], g["state"]) for g in st["groups"]] == \
        [("g0", "duo-0", 1, 2, "active"), ("g1", "duo-g1-0", 1, 2, "active")]
    assert (st["master"], st["epoch"]) == ("duo-0", 1)      # g0's, where everything read it before groups
    for pod in pods:
        p = tb.get("pod", pod, namespace)
        assert p["metadata"]["labels"]["txbroker.dev/group"] == ("g1" if "-g1-" in pod else "g0")
        args = p["spec"]["containers"][0]["args"]
        assert args[args.index("--group") + 1] == p["metadata"]["labels"]["txbroker.dev/group"]
    for pod in ("duo-0", "duo-g1-0"):
        assert broker_info(tb, namespace, pod)["role"] == "master"
    g1_slave = broker_info(tb, namespace, "duo-g1-1")
    assert g1_slave["role"] == "slave" and g1_slave["master"] == f"{pod_ip(tb, namespace, 'duo-g1-0')}:10911"

    # `kubectl get txb`: the groups and their masters
    header, row = tb.kubectl("-n", namespace, "get", "txb", name).stdout.splitlines()[:2]
    assert header.split()[:7] == ["NAME", "REPLICAS", "MASTER", "EPOCH", "PHASE", "GROUPS", "MASTERS"]
    assert row.split()[:7] == ["duo", "2", "duo-0", "1", "Running", "2", "g0=duo-0,g1=duo-g1-0"]

    # -- the route: every broker of both groups by its stable name, loaded by every broker --------
    route = route_of(tb, namespace, name)
    assert route["cluster"] == name and route["version"] == st["routeVersion"]
    assert [(g["name"], g["state"]) for g in route["groups"]] == [("g0", "active"), ("g1", "active")]
    assert route["groups"][1]["addresses"] == [f"duo-g1-{i}.duo.{namespace}.svc:10911" for i in range(2)]

    def loaded(version: int):
        def check():
            for pod in tb.list("pods", namespace, "txbroker.dev/broker=duo"):
                if not ready(pod):
                    return False
                got = admin(pod).get("/api/v1/cluster")
                if got["group"] != pod["metadata"]["labels"]["txbroker.dev/group"] or \
                        (got.get("route") or {}).get("version") != version:
                    return False
            return True
        return check
    wait_until(loaded(route["version"]), 90, f"every broker running route version {route['version']}")
    # the bootstrap Service: every group's master, nothing else
    masters = sorted(f"{pod_ip(tb, namespace, p)}:10911" for p in ("duo-0", "duo-g1-0"))
    wait_until(lambda: service_endpoints(tb, namespace, "duo-master") == masters, 60, "duo-master: both masters")

    # -- clients in pods, through the one bootstrap name, use both groups -------------------------
    tb.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cluster-clients"},
              "data": {"cluster_clients.py": (WORKLOADS / "cluster_clients.py").read_text()}}, namespace)
    bootstrap = f"duo-master.{namespace}.svc.cluster.local:10911"
    out = run_client(tb, namespace, "duo-producer", "produce", bootstrap, "Orders", "duo-pg", "40", "o")
    acked = [line.split()[1] for line in out if line.startswith("ACK ")]
    assert len(acked) == 40, out[-20:]
    per_group = {g: txload.visible(f"{pod_ip(tb, namespace, m)}:10911") for g, m in (("g0", "duo-0"), ("g1", "duo-g1-0"))}
    assert all(per_group.values()), per_group                        # both groups took transactions
    assert sum(per_group.values(), Counter()) == Counter(acked)     # each acknowledged commit once, somewhere

    # -- g1's master killed: only g1 fails over -----------------------------------------------------
    g0_before = broker_info(tb, namespace, "duo-0")
    tb.kubectl("-n", namespace, "delete", "pod", "duo-g1-0", "--grace-period=0", "--force", check=False)

    def g1_failed_over():
        t = tb.get("txb", name, namespace)
        g0, g1 = group_block(t, "g0"), group_block(t, "g1")
        assert (g0.get("master"), g0.get("epoch")) == ("duo-0", 1), f"g0 touched by g1's failover: {g0}"
        return t if g1.get("master") == "duo-g1-1" and g1.get("epoch", 1) >= 2 else None
    try:
        txb = wait_until(g1_failed_over, 90, "g1's slave promoted", interval=0.5)
    except TimeoutError:
        raise AssertionError("no failover of g1; operator log:\n" + operator.log.read_text()[-5000:]) from None
    # the decision is written first, the conditions at the end of the pass that carried it out
    txb = wait_until(lambda: (t := tb.get("txb", name, namespace)) and condition(t, "FailedOver") and t, 30,
                     "the FailedOver condition")
    st = txb["status"]
    assert (st["master"], st["epoch"]) == ("duo-0", 1)
    assert st["lastFailover"]["group"] == "g1" and st["lastFailover"]["from"] == "duo-g1-0"
    assert "lastFailover" not in group_block(txb, "g0")
    assert condition(txb, "FailedOver")["status"] == "True"
    failed = [e for e in events_for(tb, namespace, name) if e["reason"] == "FailedOver"]
    assert failed and all(e["message"].startswith("group g1: ") for e in failed), failed
    g0_after = broker_info(tb, namespace, "duo-0")
    assert (g0_after["role"], g0_after["epoch"]) == ("master", g0_before["epoch"])
    assert broker_info(tb, namespace, "duo-g1-1")["role"] == "master"
    # the killed master's pod comes back as a slave of the new one; the route did not move (stable names)
    wait_until(lambda: (p := tb.get("pod", "duo-g1-0", namespace)) and ready(p)
               and p["metadata"]["labels"]["txbroker.dev/role"] == "slave", 120, "duo-g1-0 back as a slave")
    assert route_of(tb, namespace, name)["version"] == route["version"]
    txb = wait_until(lambda: (t := tb.get("txb", name, namespace))["status"]["masters"] == "g0=duo-0,g1=duo-g1-1"
                     and t["status"]["phase"] == "Running" and t, 120, "duo Running, g1 on its new master")
    # what g1 held survived its failover (SYNC replication)
    assert txload.visible(f"{pod_ip(tb, namespace, 'duo-g1-1')}:10911") == per_group["g1"]

    # -- 2 -> 1: g1 drains, kept while it holds undelivered messages ------------------------------
    tb.kubectl("-n", namespace, "patch", "txb", name, "--type=merge", "-p", json.dumps({"spec": {"groups": 1}}))
    draining = wait_until(lambda: [g["state"] for g in route_of(tb, namespace, name)["groups"]] == ["active", "draining"]
                          and route_of(tb, namespace, name), 60, "the route: g1 draining")
    assert draining["version"] > route["version"]
    wait_until(loaded(draining["version"]), 90, f"every broker running route version {draining['version']}")
    assert admin(tb.get("pod", "duo-g1-1", namespace)).get("/api/v1/cluster")["draining"] is True

    def blocked():
        t = tb.get("txb", name, namespace)
        cond = condition(t, "ScaleDownBlocked")
        return t if cond and cond["status"] == "True" and cond["reason"] == "UndeliveredMessages" else None
    txb = wait_until(blocked, 60, "ScaleDownBlocked: UndeliveredMessages")
    g1 = group_block(txb, "g1")
    assert g1["state"] == "draining" and g1["undelivered"] >= sum(per_group["g1"].values())
    assert g1["undeliveredTopics"]["Orders"] == sum(per_group["g1"].values())   # nobody consumed them yet
    assert f"{g1['undelivered']} undelivered message(s)" in condition(txb, "ScaleDownBlocked")["message"]
    said = [e for e in events_for(tb, namespace, name) if e["reason"] == "ScaleDownBlocked"
            and "undelivered" in e["message"]]
    assert len(said) == 1 and "txbroker.dev/force-scale-down" in said[0]["message"]   # one Event, not one per pass
    assert all(tb.get("pod", p, namespace) for p in ("duo-g1-0", "duo-g1-1"))       # nothing deleted
    assert tb.kubectl("-n", namespace, "get", "txb", name, "--no-headers").stdout.split()[5] == "1"

    # -- a consumer finishes g1: it goes, and the route and status forget it ----------------------
    out = run_client(tb, namespace, "duo-consumer", "consume", bootstrap, "Orders", "duo-cg", "40", "120")
    got = Counter(line.split()[1] for line in out if line.startswith("GOT "))
    assert set(got) == set(acked), out[-20:]

    def removed():
        t = tb.get("txb", name, namespace)
        return t if [g["name"] for g in t["status"].get("groups") or []] == ["g0"] else None
    try:
        txb = wait_until(removed, 120, "g1 removed once drained")
    except TimeoutError:
        raise AssertionError(json.dumps(tb.get("txb", name, namespace)["status"], indent=1)[-3000:]) from None
    wait_until(lambda: not [p for p in tb.list("pods", namespace, "txbroker.dev/group=g1")], 60, "g1's pods gone")
    assert [g["name"] for g in route_of(tb, namespace, name)["groups"]] == ["g0"]
    assert condition(txb, "ScaleDownBlocked")["status"] == "False"
    assert txb["status"]["masters"] == "g0=duo-0"
    reasons = [e["reason"] for e in events_for(tb, namespace, name)]
    assert "GroupDrained" in reasons and "GroupRemoved" in reasons and "ForcedScaleDown" not in reasons
    wait_until(lambda: tb.get("txb", name, namespace)["status"]["phase"] == "Running", 60, "duo Running on g0")
    tb.kubectl("-n", namespace, "delete", "txb", name, "--wait=false")


@pytest.mark.parametrize("groups, words", [(0, "should be greater than or equal to 1"),
                                           (17, "should be less than or equal to 16")])
def test_a_group_count_out_of_range_is_refused_by_the_schema(crds, namespace, groups, words):
    r = crds.kubectl("create", "-n", namespace, "-f", "-", check=False,
                     input=json.dumps(txbroker("bad", groups=groups)))
    assert r.returncode != 0 and "spec.groups" in r.stderr and words in r.stderr, r.stderr
