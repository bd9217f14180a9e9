"""chaos/k8s/record.py: what the workload pod on the node sends the runner. The checker's verdict on
the record read back must be its verdict on the pod's own history and reader, anomalies included:
a field the record leaves out reads as empty, and its check then passes without having looked
(a member read without its job's property went unreported on the node until the record carried it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos import checker  # noqa: E402
from chaos.k8s import record  # noqa: E402
from chaos.reader import Reader  # noqa: E402
from chaos.workload import History, Tx  # noqa: E402


def run_with_every_read_anomaly() -> tuple[History, Reader]:
    """A job of two members, both read, one of them also read without its job's property; a queue
    the reader could not read past; an offset rewritten and one gone back."""
    h = History()
    h.jobs["j1"] = "g0"
    for txid, group in (("j1-a", "g0"), ("j1-b", "g1")):
        h.add(txid, Tx([f"{txid}.0"], "COMMIT", acked="COMMIT", kind="member", job="j1", groups=[group],
                       topics=["Orders"]))
    reader = Reader(lambda: {})
    reader.seen = {("g0", "Orders", 0, 1): "j1-a.0", ("g1", "Orders", 0, 1): "j1-b.0"}
    reader.queues = {("g0", "Orders"): 4, ("g1", "Orders"): 4}
    reader.member_jobs["j1-a.0"] = {"j1"}
    reader.member_jobs["j1-b.0"] = {"j1", None}
    reader.stuck.append("g1 Orders:2: a pull from offset 7 reads nothing and the queue ends at 9")
    reader.rewritten.append("g0 Orders:0 offset 1: j1-a.0 became x")
    reader.went_back.append("g0 Orders:3: end 5 after 6")
    return h, reader


def test_the_runner_reaches_the_pods_verdict_on_every_anomaly_the_reader_saw():
    h, reader = run_with_every_read_anomaly()
    on_the_pod = checker.check(h, reader, {}, {})
    assert {"properties lost", "read stuck"} <= set(on_the_pod)

    h2, reader2 = record.load(json.loads(json.dumps(record.dump(h, reader))))   # the wire is JSON
    assert checker.check(h2, reader2, {}, {}) == on_the_pod


def test_a_clean_run_stays_clean_through_the_record():
    h, reader = run_with_every_read_anomaly()
    reader.member_jobs["j1-b.0"] = {"j1"}
    reader.stuck.clear(), reader.rewritten.clear(), reader.went_back.clear()
    assert checker.check(h, reader, {}, {}) == {}
    h2, reader2 = record.load(json.loads(json.dumps(record.dump(h, reader))))
    assert checker.check(h2, reader2, {}, {}) == {}
