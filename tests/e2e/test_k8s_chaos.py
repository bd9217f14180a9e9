"""The fault harness on the real node (chaos/k8s/, `make chaos-k8s` runs the long randomized ones):
one short fixed-seed schedule against an operator-deployed TxBroker of two broker groups of three,
the chart's two operator replicas, the clients in a pod. Its seed draws one fault of each family
first: the operator's leader killed while it is failing over a crash-looping master (the standby
finishes the failover), a master cut off from its group's peers by iptables in its pod's network
namespace, a master's pod force-deleted, a slave's process paused. The whole history is judged by
chaos/checker.py, as the local harness's are.
"""

from __future__ import annotations

import json

import pytest

from chaos.k8s import schedule
from chaos.k8s.deploy import Api
from chaos.k8s.node import FAMILIES

pytestmark = pytest.mark.e2e

SEED = 10  # kill-operator-mid-failover, partition-master, delete-master, pause-slave, then any
DURATION = 45


@pytest.mark.slow
@pytest.mark.timeout(1200)   # deploy, faults (the operator's handover alone takes 15-20 s), settle, consume, read
def test_a_fixed_seed_schedule_on_the_node_keeps_every_invariant(crds, tmp_path):
    r = schedule.run(crds, Api(crds), SEED, DURATION, tmp_path, families=list(FAMILIES))
    (tmp_path / f"seed-{SEED}.json").write_text(json.dumps(r, indent=2))   # the report, beside a failure's logs
    assert "error" not in r, r["error"]
    assert r["anomalies"] == {}, json.dumps(r["anomaly_details"], indent=1) + f"\n(logs and history in {tmp_path})"
    assert set(r["faults_by_family"]) == set(FAMILIES), (r["faults_by_family"], r["faults_skipped"])
    mid = next(e for e in r["events"] if e["kind"] == "kill-operator-mid-failover")
    assert mid["failover_finished_after_s"] is not None, mid   # the standby finished what the leader started
    # the mid-failover kill makes one failover and one handover of the Lease by construction; whether
    # a deleted master's pod is back within the 3 s grace (no failover then) is the machine's timing
    assert r["operator"]["lease_transitions"] >= 1 and r["failovers"] >= 1, (r["operator"], r["failovers"])
    assert r["commits_acknowledged"] > 0 and r["group"]["consumed"] > 0, (r["operations"], r["group"])
    # `properties lost` looked at something: job members read back, each with its job's shared property
    assert r["members_read_with_their_job"] > 0, r["operations"]
    assert r["unresolved_after_settling"] == {"g0": 0, "g1": 0}
