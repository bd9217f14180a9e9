"""Transactions that span two broker groups on the real node (issue 18): a client pod commits
two-message transactions, one message on each group, through the bootstrap Service, while group
g1's master is force-deleted and the operator fails g1 over. Every transaction ends all or nothing:
each acknowledged one visible on both groups exactly once, the others on both or on neither; the
one producer never needed a restart. How the operator runs: tests/e2e/operator_env.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from cluster import BROKER_IMAGE
from operator_env import admin, finished, start_operator, txbroker
from support import txload
from support.waiting import wait_until

pytestmark = pytest.mark.e2e

WORKLOADS = Path(__file__).resolve().parent / "workloads"


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-span-{worker_id}")


def master_of(tb, namespace: str, name: str, group: str) -> dict:
    txb = tb.get("txb", name, namespace)
    block = next(g for g in txb["status"]["groups"] if g["name"] == group)
    return tb.get("pod", block["master"], namespace)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_transactions_spanning_groups_stay_whole_across_a_group_failover(operator):
    tb, namespace, name = operator.testbed, operator.namespace, "span"
    tb.apply(txbroker(name, replicas=2, groups=2, replication="SYNC", flush="SYNC",
                      failover={"gracePeriodSeconds": 3}), namespace)
    wait_until(lambda: (tb.get("txb", name, namespace).get("status") or {}).get("masters") == "g0=span-0,g1=span-g1-0"
               and tb.get("txb", name, namespace)["status"].get("phase") == "Running", 240, "span Running, two groups")
    tb.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "spanning-clients"},
              "data": {"spanning_clients.py": (WORKLOADS / "spanning_clients.py").read_text()}}, namespace)
    bootstrap = f"{name}-master.{namespace}.svc.cluster.local:10911"
    tb.apply({"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "span-producer", "labels": {"app": "orders"}},
              "spec": {"restartPolicy": "Never",
                       "containers": [{"name": "main", "image": BROKER_IMAGE,
                                       "command": ["python", "/workloads/spanning_clients.py", bootstrap, "Ledger",
                                                   "span-pg", "150"],
                                       "volumeMounts": [{"name": "w", "mountPath": "/workloads"}]}],
                       "volumes": [{"name": "w", "configMap": {"name": "spanning-clients"}}]}}, namespace)

    def acked() -> list[str]:
        try:
            out = tb.logs("span-producer", namespace)
        except Exception:  # noqa: BLE001 - not started yet
            return []
        return [line.split()[1] for line in out.splitlines() if line.startswith("ACK ")]

    wait_until(lambda: len(acked()) >= 20, 120, "spanning transactions committing")
    tb.kubectl("-n", namespace, "delete", "pod", "span-g1-0", "--grace-period=0", "--force", check=False)
    wait_until(lambda: master_of(tb, namespace, name, "g1")["metadata"]["name"] == "span-g1-1", 90,
               "g1 failed over to span-g1-1")
    p = wait_until(lambda: finished(tb, namespace, "span-producer"), 300, "the producer to finish")
    lines = tb.logs("span-producer", namespace).splitlines()
    assert p["status"]["phase"] == "Succeeded" and lines[-1] == "DONE", lines[-20:]
    ok = [line.split() for line in lines if line.startswith("ACK ")]
    assert all(groups == "g0,g1" for _a, _t, groups in ok), ok[:5]      # each spanned both groups
    committed = {t for _a, t, _g in ok}
    assert len(committed) >= 100, f"{len(committed)} of 150 acknowledged: {[x for x in lines if 'FAIL' in x][:5]}"

    masters = {g: master_of(tb, namespace, name, g) for g in ("g0", "g1")}
    for g, m in masters.items():
        wait_until(lambda m=m: txload.settled(f"http://{m['status']['podIP']}:10912"), 120,
                   f"{g}: every transaction decided and published")
    seen = {g: txload.visible(f"{m['status']['podIP']}:10911", "Ledger") for g, m in masters.items()}
    halves = {g: Counter(b.split("-", 1)[1] for b in c.elements()) for g, c in seen.items()}
    assert set(halves["g0"].values()) <= {1} and set(halves["g1"].values()) <= {1}, "a half visible twice"
    assert set(halves["g0"]) == set(halves["g1"]), (
        f"torn: only on g0 {sorted(set(halves['g0']) - set(halves['g1']))[:5]}, "
        f"only on g1 {sorted(set(halves['g1']) - set(halves['g0']))[:5]}")
    assert committed <= set(halves["g0"]), f"acknowledged, not visible: {sorted(committed - set(halves['g0']))[:5]}"
    assert all(b.startswith("a-") for b in seen["g0"]) and all(b.startswith("b-") for b in seen["g1"])
    assert admin(masters["g1"]).get("/api/v1/drain")["waiting_on"] == {}
    tb.kubectl("-n", namespace, "delete", "txb", name, "--wait=false")
