"""The orders job's recovery of earlier runs (the dataset half of its transaction), without Spark."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
