"""The orders job: its recovery of earlier runs (the dataset half of its transaction) without Spark,
then the job as a process against a real broker and checker when it fails: the dataset write
failing (abort), and the driver dying before or after its decision."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spark_helpers import kill_group
from txbroker_spark.ledger import ABORTED, COMMITTED, Decision, Ledger

JOB = Path(__file__).resolve().parents[2] / "spark" / "jobs" / "orders_job.py"


def load_job():
    spec = importlib.util.spec_from_file_location("orders_job_under_test", JOB)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_recover_moves_committed_and_deletes_aborted_staging(tmp_path):
    job = load_job()
    led = Ledger(tmp_path / "ledger").ensure()
    out = tmp_path / "result"
    for name in ("done", "failed", "running"):
        (out / "_staging" / name).mkdir(parents=True)
        (out / "_staging" / name / "part-0.parquet").write_bytes(b"x")
    led.decide_job("done", Decision(COMMITTED, ["done-p0-t1-c0"], by="application"))
    led.decide_job("failed", Decision(ABORTED, [], by="checker", reason="driver gone"))
    job.recover(out, led)
    assert (out / "job=done" / "part-0.parquet").exists()  # a crash after the decision: finished
    assert not (out / "_staging" / "failed").exists()  # aborted: its dataset is never published
    assert (out / "_staging" / "running").exists()  # undecided: left alone
    job.recover(out, led)  # idempotent
    assert sorted(p.name for p in out.iterdir()) == ["_staging", "job=done"]


def test_generated_orders_are_deterministic(tmp_path):
    import pyarrow.parquet as pq

    job = load_job()
    job.ensure_input(tmp_path / "a", 50)
    job.ensure_input(tmp_path / "b", 50)
    a, b = pq.read_table(tmp_path / "a"), pq.read_table(tmp_path / "b")
    assert a.num_rows == 50 and a.equals(b)
    assert a.column("order_id").to_pylist()[:2] == ["o-00000000", "o-00000001"]


# ---- the job as a process, against a real broker and checker --------------------------------

ORDERS = 200


def run_job(env, tmp_path, topic, *extra, timeout=420) -> tuple[int, str]:
    """Run orders_job.py to its end (or its injected crash); then SIGKILL what is left of its process
    group (its JVM, its Python workers), as when a driver pod goes."""
    log = tmp_path / "job.log"
    with open(log, "ab") as f:
        proc = subprocess.Popen([sys.executable, str(JOB), "--brokers", env.brokers, "--group", env.group,
                                 "--topic", topic, "--ledger", str(env.ledger), "--input", str(tmp_path / "orders"),
                                 "--output", str(tmp_path / "result"), "--orders", str(ORDERS), "--partitions", "2",
                                 "--batch-size", "50", "--progress-seconds", "2",
                                 "--summary-json", str(tmp_path / "summary.json"), *extra],
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout)
    finally:
        kill_group(proc)
    return code, log.read_text(errors="replace")


def summary_line(out: str) -> dict[str, str]:
    (line,) = [ln for ln in out.splitlines() if ln.startswith("SUMMARY ")]
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def the_job(env) -> str:
    (job,) = Ledger(env.ledger).jobs()
    return job


def assert_events_are_the_dataset(events, dataset: Path, job: str) -> None:
    """Consumer side: one event per order of the committed dataset, with that row's content."""
    import pyarrow.parquet as pq

    t = pq.read_table(dataset, columns=["order_id", "customer_id", "total", "status"]).to_pylist()
    assert len(t) == ORDERS
    expected = sorted(({**r, "total": str(r["total"]), "job": job} for r in t), key=lambda r: r["order_id"])
    got = sorted((json.loads(m.body) for m in events), key=lambda b: b["order_id"])
    assert len(got) == len(expected) and got == expected
    assert all(m.keys == json.loads(m.body)["order_id"] and m.tags == json.loads(m.body)["status"] for m in events)


@pytest.mark.timeout(600)
def test_failed_dataset_write_aborts_the_job_and_publishes_nothing(tx_env, tmp_path):
    """The local transaction fails (its staging directory cannot be created) after every event was
    sent as a half message, one task attempt crashing on the way: the job records ABORTED, rolls back
    its transactions, check-back rolls back the crashed attempt's; nothing is visible."""
    (tmp_path / "result").mkdir()
    (tmp_path / "result" / "_staging").write_text("not a directory")  # the dataset write fails
    code, out = run_job(tx_env, tmp_path, "AbortedOrders", "--fail-partition", "1")
    assert code == 1, out[-4000:]
    job = the_job(tx_env)
    s = summary_line(out)
    assert (s["job"], s["decision"], s["rows"], s["committed"]) == (job, "ABORTED", str(ORDERS), "0")
    # the job rolled back its own, but cannot count what check-back rolls back for the crashed attempt
    assert (s["rolled_back"], s["discarded_attempts"]) == ("unknown", "1")
    # progress, from the driver: the writing stage's tasks, the crashed attempt among them
    assert re.search(rf"job {job}: 1/4 sending: stage \d+: 2/2 tasks done, 0 running, 1 failed attempt \(", out)
    d = Ledger(tx_env.ledger).job_decision(job)
    assert d.decision == "ABORTED" and d.by == "application"
    tx_env.wait_settled()
    assert tx_env.events("AbortedOrders") == []
    answers = tx_env.checker_answers()
    kept = set(Ledger(tx_env.ledger).prepared(job)["txids"])
    crashed = [t for t in answers if t.startswith(f"{job}-p1-") and t not in kept]
    assert crashed and all(answers[t][-1] == "ROLLBACK" for t in crashed)
    assert [p.name for p in (tmp_path / "result").iterdir()] == ["_staging"]  # no dataset


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crash_between_dataset_and_decision_publishes_neither(tx_env, tmp_path):
    """The driver dies after writing its dataset to staging, before the decision: the checker sees
    it gone and rolls every event back; the next run's recovery deletes the staging dataset."""
    code, out = run_job(tx_env, tmp_path, "CrashedOrders", "--inject-crash", "after-dataset")
    assert code == 17 and "SUMMARY" not in out, out[-4000:]
    job = the_job(tx_env)
    staging = tmp_path / "result" / "_staging" / job
    assert any(staging.glob("*.parquet"))  # the local transaction was done, but never committed
    tx_env.wait_settled()
    d = Ledger(tx_env.ledger).job_decision(job)
    assert d.decision == "ABORTED" and d.by == "checker" and "is gone" in d.reason
    assert tx_env.events("CrashedOrders") == []
    load_job().recover(tmp_path / "result", Ledger(tx_env.ledger))  # what the next run does first
    assert list((tmp_path / "result" / "_staging").iterdir()) == []
    assert not list((tmp_path / "result").glob("job=*"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crash_after_the_decision_publishes_exactly_the_dataset(tx_env, tmp_path):
    """The driver dies right after recording COMMITTED, before moving its dataset and sending the
    ENDs: check-back commits the events, the next run's recovery moves the dataset into place, and
    the consumer reads exactly the dataset."""
    code, out = run_job(tx_env, tmp_path, "DecidedOrders", "--inject-crash", "after-decision")
    assert code == 17 and "SUMMARY" not in out, out[-4000:]
    job = the_job(tx_env)
    d = Ledger(tx_env.ledger).job_decision(job)
    assert d.committed and d.by == "application" and d.rows == ORDERS
    tx_env.wait_settled()  # committed by check-back from the ledger
    assert all(tx_env.transaction(t)["state"] == "COMMITTED" for t in d.txids)
    load_job().recover(tmp_path / "result", Ledger(tx_env.ledger))
    dataset = tmp_path / "result" / f"job={job}"
    assert dataset.is_dir() and not (tmp_path / "result" / "_staging" / job).exists()
    events = tx_env.events("DecidedOrders")
    assert {m.transaction_id for m in events} == set(d.txids)
    assert_events_are_the_dataset(events, dataset, job)
