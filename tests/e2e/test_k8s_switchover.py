"""Switchover, not failover, on the real node (issue 32, item 2): under transactional load, the
annotation txbroker.dev/switchover moves mastership to the pod it names, and an eviction of the
master's pod (what a node drain does, through the eviction API) is a switchover too; each group's
PodDisruptionBudget refuses a second eviction while the first broker is away. Every acknowledged
commit survives, none twice, no failover happens; the client-visible failures are counted. Also
the Version column of `kubectl get txb` (item 1)."""

from __future__ import annotations

import json
import threading

import pytest
from support import txload
from support.waiting import wait_until
from cluster import VERSION
from operator_env import (
    addresses, broker_info, brokers_report, condition, events_for, ready, start_operator, txbroker, wait_broker,
)

pytestmark = pytest.mark.e2e

NAME = "sw"


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-switch-{worker_id}")


def evict(tb, namespace: str, pod: str):
    """POST pods/<pod>/eviction, as `kubectl drain` does for each pod."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    return tb.kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", "-f", "-",
                      input=json.dumps(body), check=False)


def master_moved(tb, namespace: str, away_from: str):
    def check():
        t = tb.get("txb", NAME, namespace)
        st = t.get("status") or {}
        m = st.get("master")
        return (m and m != away_from and not (st["groups"][0].get("switchover")) and t["status"]["phase"] in (
            "Running", "Degraded", "Updating") and broker_info(tb, namespace, m)["role"] == "master" and t)
    return check


def test_the_annotation_and_an_eviction_switch_over_without_losing_an_acknowledged_commit(operator):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker(NAME, replicas=3, replication="ASYNC", flush="SYNC",
                      transaction={"checkIntervalSeconds": 1, "timeoutSeconds": 1, "checkMax": 300}), namespace)
    wait_broker(operator, namespace, NAME)
    wait_until(lambda: all(b.get("inSync") for b in tb.get("txb", NAME, namespace)["status"]["brokers"]
                           if b["role"] == "slave"), 60, "slaves in sync")
    # item 1: the Version column
    out = tb.kubectl("-n", namespace, "get", "txb", NAME).stdout.splitlines()
    assert "VERSION" in out[0].split() and out[1].split()[out[0].split().index("VERSION")] == VERSION, out
    assert condition(tb.get("txb", NAME, namespace), "ReplicationCompatible")["status"] == "True"

    everyone = addresses(tb, namespace, NAME, 3)
    ledger, acked, failed, stop = txload.Ledger(), {}, [], threading.Event()
    load = threading.Thread(target=txload.run_load, args=(everyone, ledger, acked, stop, 4), kwargs={"failed": failed})
    load.start()
    try:
        wait_until(lambda: len(acked) >= 50, 60, "load on sw-0")

        # 1. by hand: the annotation names the pod to become master
        tb.kubectl("-n", namespace, "annotate", "txb", NAME, "txbroker.dev/switchover=sw-2")
        try:
            txb = wait_until(master_moved(tb, namespace, "sw-0"), 60, "the switchover to sw-2")
        except TimeoutError:
            raise AssertionError(brokers_report(tb, namespace, NAME, 3) + operator.log.read_text()[-4000:])
        assert txb["status"]["master"] == "sw-2"
        txb = wait_until(lambda: (t := tb.get("txb", NAME, namespace)) and "txbroker.dev/switchover" not in
                         (t["metadata"].get("annotations") or {}) and t, 30, "the annotation removed once done")
        assert txb["status"]["groups"][0]["lastSwitchover"]["from"] == "sw-0"
        assert broker_info(tb, namespace, "sw-0")["master"] == f"{tb.get('pod', 'sw-2', namespace)['status']['podIP']}:10911"
        before = len(acked)
        wait_until(lambda: len(acked) >= before + 50, 60, "load on sw-2")

        # 2. a drain's eviction of the master's pod: a switchover first, then the pod goes
        old_uid = tb.get("pod", "sw-2", namespace)["metadata"]["uid"]
        # as `kubectl drain` does: asked again while the budget says no (its status lags a moment
        # behind the pods' readiness)
        wait_until(lambda: evict(tb, namespace, "sw-2").returncode == 0, 60, "the eviction of sw-2 accepted")
        txb = wait_until(master_moved(tb, namespace, "sw-2"), 60, "the switchover away from the evicted sw-2")
        # the budget: one broker of the group away at a time
        other = next(p for p in ("sw-0", "sw-1") if p != txb["status"]["master"])
        refused = evict(tb, namespace, other)
        assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused.stderr
        wait_until(lambda: (p := tb.get("pod", "sw-2", namespace)) and p["metadata"]["uid"] != old_uid and ready(p),
                   120, "sw-2 back, as a slave")
        wait_until(lambda: broker_info(tb, namespace, "sw-2")["role"] == "slave", 30, "sw-2 a slave")
        before = len(acked)
        wait_until(lambda: len(acked) >= before + 50, 60, "load after the eviction")
    finally:
        stop.set()
        load.join(120)
    master = tb.get("txb", NAME, namespace)["status"]["master"]
    ip = tb.get("pod", master, namespace)["status"]["podIP"]
    txload.settle(f"{ip}:10911", f"http://{ip}:10912", ledger, timeout=120)
    seen = txload.visible(f"{ip}:10911")
    problems = txload.invariant_violations(seen, acked, must_keep_acked=True)
    assert not problems, problems[:10]
    txb = tb.get("txb", NAME, namespace)
    assert "lastFailover" not in txb["status"] and condition(txb, "FailedOver") is None
    said = [e["reason"] for e in events_for(tb, namespace, NAME)]
    assert said.count("Switchover") >= 2 and "FailedOver" not in said, said
    print(f"\nswitchovers under load (annotation, eviction): {len(acked)} acknowledged, {len(failed)} client-visible "
          f"failures" + (f"; first: {failed[0]}" if failed else ""))
