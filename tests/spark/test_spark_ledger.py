"""The ledger and the checker's decision rules, without Spark or a broker."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from txbroker.client import LocalTransactionState as S
from txbroker_spark.checker import LedgerResolver
from txbroker_spark.ledger import ABORTED, COMMITTED, Decision, Ledger, driver_identity, identity_is_dead, now_ms
from txbroker_spark.options import P_BATCH, P_EPOCH, P_JOB, P_KIND, P_QUERY


def batch_props(job):
    return {P_KIND: "batch", P_JOB: job}


def stream_props(query, batch, epoch):
    return {P_KIND: "stream", P_JOB: f"{query}.b{batch}.e{epoch}", P_QUERY: query, P_BATCH: str(batch),
            P_EPOCH: str(epoch)}


def dead_identity():
    """The identity of a process that has exited (as the checker would find a killed driver)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(f"/proc/{proc.pid}/stat") as f:
        stat = f.read()
    ticks = int(stat[stat.rindex(")") + 2:].split()[19])
    ident = {**driver_identity(), "pid": proc.pid, "start_ticks": ticks}
    assert not identity_is_dead(ident)
    proc.kill()
    proc.wait()
    assert identity_is_dead(ident)
    return ident


def test_first_decision_wins_and_files_are_complete_json(tmp_path):
    led = Ledger(tmp_path / "l").ensure()
    first = led.decide_job("j1", Decision(COMMITTED, ["a", "b"], by="driver"))
    second = led.decide_job("j1", Decision(ABORTED, [], reason="late", by="checker"))
    assert first.committed and second.committed and second.txids == ["a", "b"]
    doc = json.loads((tmp_path / "l" / "jobs" / "j1" / "decision.json").read_text())
    assert doc["decision"] == COMMITTED and doc["txids"] == ["a", "b"] and doc["by"] == "driver"
    assert not [p for p in (tmp_path / "l" / "jobs" / "j1").iterdir() if p.name.startswith(".")]  # no temp files


def test_racing_commit_and_abort_agree_on_one_decision(tmp_path):
    """Many threads (and separate Ledger objects, as separate processes would) race to decide one job."""
    results = []

    def decide(i):
        led = Ledger(tmp_path / "l")
        d = Decision(COMMITTED, ["t"], by=f"d{i}") if i % 2 else Decision(ABORTED, [], by=f"c{i}")
        results.append(led.decide_job("race", d))

    Ledger(tmp_path / "l").ensure()
    threads = [threading.Thread(target=decide, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({(r.decision, r.by) for r in results}) == 1
    assert Ledger(tmp_path / "l").job_decision("race").by == results[0].by


def test_batch_rules(tmp_path):
    led = Ledger(tmp_path / "l").ensure()
    r = LedgerResolver(led, default_deadline_ms=60_000)
    # committed: in the decision -> COMMIT; a discarded attempt's id -> ROLLBACK
    led.register_job("ok", deadline_ms=60_000)
    led.decide_job("ok", Decision(COMMITTED, ["ok-p0-t1-c0"], by="driver"))
    assert r.resolve("ok-p0-t1-c0", batch_props("ok")) is S.COMMIT
    assert r.resolve("ok-p0-t7-c0", batch_props("ok")) is S.ROLLBACK
    # aborted -> ROLLBACK
    led.decide_job("bad", Decision(ABORTED, [], by="driver"))
    assert r.resolve("bad-p0-t1-c0", batch_props("bad")) is S.ROLLBACK
    # running (this process is alive), within its deadline -> UNKNOWN, nothing recorded
    led.register_job("running", deadline_ms=60_000)
    assert r.resolve("running-p0-t1-c0", batch_props("running")) is S.UNKNOWN
    assert led.job_decision("running") is None
    # not from a Spark job -> UNKNOWN
    assert r.resolve("x", {}) is S.UNKNOWN


def test_dead_driver_is_rolled_back_and_recorded(tmp_path):
    led = Ledger(tmp_path / "l").ensure()
    (led.job_dir("dead")).mkdir(parents=True)
    (led.job_dir("dead") / "start.json").write_text(json.dumps(
        {"job": "dead", "created_ms": now_ms(), "deadline_ms": 3_600_000, "driver": dead_identity()}))
    r = LedgerResolver(led)
    assert r.resolve("dead-p0-t1-c0", batch_props("dead")) is S.ROLLBACK
    d = led.job_decision("dead")
    assert d.decision == ABORTED and d.by == "checker" and "is gone" in d.reason
    # a commit arriving now loses: the driver's commit() would read this ABORTED decision
    assert not led.decide_job("dead", Decision(COMMITTED, ["dead-p0-t1-c0"])).committed


def test_deadline_rolls_back_a_job_with_no_decision(tmp_path):
    led = Ledger(tmp_path / "l").ensure()
    (led.job_dir("old")).mkdir(parents=True)
    (led.job_dir("old") / "start.json").write_text(json.dumps(
        {"job": "old", "created_ms": now_ms() - 120_000, "deadline_ms": 60_000, "driver": driver_identity()}))
    assert LedgerResolver(led).resolve("old-p0-t1-c0", batch_props("old")) is S.ROLLBACK
    assert "deadline" in led.job_decision("old").reason
    # without a start record the message's birth and the checker's default deadline count
    r = LedgerResolver(led, default_deadline_ms=1_000)
    assert r.resolve("ghost-p0-t1-c0", batch_props("ghost"), born_ms=now_ms() - 5_000) is S.ROLLBACK
    assert r.resolve("young-p0-t1-c0", batch_props("young"), born_ms=now_ms()) is S.UNKNOWN


def test_stream_rules_and_epochs(tmp_path):
    led = Ledger(tmp_path / "l").ensure()
    r = LedgerResolver(led)
    q = "q1"
    led.register_stream_driver(q, deadline_ms=60_000)  # this (live) process drives it
    led.decide_batch(q, 0, 0, Decision(COMMITTED, ["s-b0-x"], by="driver"))
    assert r.resolve("s-b0-x", stream_props(q, 0, 0)) is S.COMMIT
    assert r.resolve("s-b0-y", stream_props(q, 0, 0)) is S.ROLLBACK
    assert r.resolve("s-b1-x", stream_props(q, 1, 0)) is S.UNKNOWN  # batch 1 still running
    # an abort bumps the epoch first, so a replay uses ids the abort never touched
    assert led.stream_epoch(q) == 0
    led.decide_batch(q, 1, 0, Decision(ABORTED, [], by="driver"))
    assert led.stream_epoch(q) == 1
    assert r.resolve("s-b1-x", stream_props(q, 1, 0)) is S.ROLLBACK
    led.decide_batch(q, 1, 1, Decision(COMMITTED, ["s-b1-e1"], by="driver"))
    assert led.committed_batch(q, 1)[0] == 1
    # a stray id of batch 1 at an epoch that was never decided: the batch is committed elsewhere
    assert r.resolve("s-b1-e2", stream_props(q, 1, 2)) is S.ROLLBACK


def test_a_decision_written_while_the_checker_reads_is_followed(tmp_path):
    """The driver's COMMIT of a micro-batch lands between the checker's two reads (its own epoch's
    decision: none yet; the batch's committed decision at any epoch: there). That decision is at
    this very epoch, so it must be followed, not taken for another epoch's: a member it names was
    answered ROLLBACK (seen under CI load), the broker refused the driver's commit, and the batch's
    rows would have been lost."""
    led = Ledger(tmp_path / "l").ensure()
    q = "q1"
    led.register_stream_driver(q, deadline_ms=60_000)
    read = led.batch_decision

    def decided_just_after_reading(query, batch, epoch):
        first = read(query, batch, epoch)
        if first is None and read(query, batch, epoch) is None:
            led.decide_batch(q, 0, 0, Decision(COMMITTED, ["s-b0-x"], by="driver"))
        return first
    led.batch_decision = decided_just_after_reading
    assert LedgerResolver(led).resolve("s-b0-x", stream_props(q, 0, 0)) is S.COMMIT


def test_dead_stream_driver_aborts_the_open_batch(tmp_path):
    led = Ledger(tmp_path / "l").ensure()
    q = "q2"
    led.stream_dir(q).mkdir(parents=True)
    (led.stream_dir(q) / "driver.json").write_text(json.dumps(
        {"query": q, "created_ms": now_ms(), "deadline_ms": 3_600_000, "driver": dead_identity()}))
    assert LedgerResolver(led).resolve("s-b3", stream_props(q, 3, 0), born_ms=now_ms()) is S.ROLLBACK
    assert led.batch_decision(q, 3, 0).decision == ABORTED
    assert led.stream_epoch(q) == 1
    # the restarted query registers itself: alive again, its own open batches are UNKNOWN
    led.register_stream_driver(q, deadline_ms=3_600_000)
    assert LedgerResolver(led).resolve("s-b4", stream_props(q, 4, 1), born_ms=now_ms()) is S.UNKNOWN
