"""The orders job: its recovery of earlier runs (the dataset half of its transaction), then the job as
a process against a real broker when it fails: the dataset write failing (abort), and the driver
dying before or after its decision. The broker keeps the decision: no checker, no ledger."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spark_helpers import kill_group
from support.waiting import wait_until
from txbroker.client import JobCoordinator, Message

JOB = Path(__file__).resolve().parents[2] / "spark" / "jobs" / "orders_job.py"


def load_job():
    spec = importlib.util.spec_from_file_location("orders_job_under_test", JOB)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_recover_moves_committed_and_deletes_aborted_staging(tx_env, tmp_path):
    from txbroker_spark import DeferredJob

    job = load_job()
    out = tmp_path / "result"
    for name in ("done", "failed", "running", "never-opened"):
        (out / "_staging" / name).mkdir(parents=True)
        (out / "_staging" / name / "part-0.parquet").write_bytes(b"x")
    with JobCoordinator(tx_env.group, tx_env.brokers) as c:
        for name in ("done", "failed", "running"):
            j = c.open(60, name)
            t = c.send(j.job_id, Message("Recovered", name.encode()))
            c.prepare(j.job_id, [t])
            if name == "done":
                c.commit(j.job_id)
            elif name == "failed":
                c.abort(j.job_id)

    def job_for(name):
        return DeferredJob(tx_env.brokers, tx_env.group, name)

    job.recover(out, job_for)
    assert (out / "job=done" / "part-0.parquet").exists()  # a crash after the decision: finished
    assert not (out / "_staging" / "failed").exists()  # aborted: its dataset is never published
    assert not (out / "_staging" / "never-opened").exists()
    assert (out / "_staging" / "running").exists()  # undecided: left alone (its run may be at work)
    job.recover(out, job_for)  # idempotent
    assert sorted(p.name for p in out.iterdir()) == ["_staging", "job=done"]


def test_generated_orders_are_deterministic(tmp_path):
    import pyarrow.parquet as pq

    job = load_job()
    job.ensure_input(tmp_path / "a", 50)
    job.ensure_input(tmp_path / "b", 50)
    a, b = pq.read_table(tmp_path / "a"), pq.read_table(tmp_path / "b")
    assert a.num_rows == 50 and a.equals(b)
    assert a.column("order_id").to_pylist()[:2] == ["o-00000000", "o-00000001"]


# ---- the job as a process, against a real broker --------------------------------------------

ORDERS = 200


def run_job(env, tmp_path, topic, *extra, timeout=420) -> tuple[int, str]:
    """Run orders_job.py to its end (or its injected crash); then SIGKILL what is left of its process
    group (its JVM, its Python workers), as when a driver pod goes."""
    log = tmp_path / "job.log"
    with open(log, "ab") as f:
        proc = subprocess.Popen([sys.executable, str(JOB), "--brokers", env.brokers, "--group", env.group,
                                 "--topic", topic, "--input", str(tmp_path / "orders"),
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


def the_job(env) -> dict:
    """The run's broker job (its name is the run's job name), with its member ids."""
    return env.only_job()


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
    sent as a half message, one task attempt crashing on the way: the job records ABORTED, and the
    broker rolls back every half message, the crashed attempt's too; nothing is visible."""
    (tmp_path / "result").mkdir()
    (tmp_path / "result" / "_staging").write_text("not a directory")  # the dataset write fails
    code, out = run_job(tx_env, tmp_path, "AbortedOrders", "--fail-partition", "1",
                        "--admin-url", tx_env.admin_url)
    assert code == 1, out[-4000:]
    job = the_job(tx_env)
    s = summary_line(out)
    assert (s["job"], s["decision"], s["rows"], s["committed"]) == (job["name"], "ABORTED", str(ORDERS), "0")
    # with --admin-url the job counts every half transaction the broker rolled back, the crashed
    # attempt's included (4 kept + 2 crashed: 100 rows per partition, 50 per transaction)
    assert (s["rolled_back"], s["discarded_attempts"]) == (str(int(s["transactions"]) + 2), "1")
    # progress, from the driver: the writing stage's tasks, the crashed attempt among them
    assert re.search(rf"job {job['name']}: 1/4 sending: stage \d+: 2/2 tasks done, 0 running, 1 failed attempt \(",
                     out)
    assert (job["state"], job["by"]) == ("ABORTED", "client")
    tx_env.wait_settled()
    assert tx_env.events("AbortedOrders") == []
    assert [p.name for p in (tmp_path / "result").iterdir()] == ["_staging"]  # no dataset


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crash_between_dataset_and_decision_publishes_neither(tx_env, tmp_path):
    """The driver dies after writing its dataset to staging, before the decision: the broker aborts
    the job at its deadline, rolling every event back; the next run's recovery deletes the staging
    dataset."""
    code, out = run_job(tx_env, tmp_path, "CrashedOrders", "--inject-crash", "after-dataset",
                        "--deadline-seconds", "20")
    assert code == 17 and "SUMMARY" not in out, out[-4000:]
    job = the_job(tx_env)
    staging = tmp_path / "result" / "_staging" / job["name"]
    assert any(staging.glob("*.parquet"))  # the local transaction was done, but never committed
    assert job["state"] == "PREPARED"
    job = tx_env.wait_job(lambda j: j["state"] == "ABORTED", 60, "the broker to abort the job at its deadline")
    assert job["by"] == "deadline"
    tx_env.wait_settled()
    assert tx_env.events("CrashedOrders") == []
    from txbroker_spark import DeferredJob

    load_job().recover(tmp_path / "result", lambda n: DeferredJob(tx_env.brokers, tx_env.group, n))  # the next run
    assert list((tmp_path / "result" / "_staging").iterdir()) == []
    assert not list((tmp_path / "result").glob("job=*"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crash_after_the_decision_publishes_exactly_the_dataset(tx_env, tmp_path):
    """The driver dies right after the COMMIT decision, before moving its dataset: the broker
    publishes the events from the decision, the next run's recovery moves the dataset into place, and
    the consumer reads exactly the dataset."""
    code, out = run_job(tx_env, tmp_path, "DecidedOrders", "--inject-crash", "after-decision")
    assert code == 17 and "SUMMARY" not in out, out[-4000:]
    job = the_job(tx_env)
    assert (job["state"], job["by"]) == ("COMMITTED", "client")
    wait_until(lambda: tx_env.job(job["job_id"])["resolved"], 60, "the broker to publish the events")
    assert all(tx_env.transaction(t)["state"] == "COMMITTED" for t in job["member_ids"])
    from txbroker_spark import DeferredJob

    load_job().recover(tmp_path / "result", lambda n: DeferredJob(tx_env.brokers, tx_env.group, n))
    dataset = tmp_path / "result" / f"job={job['name']}"
    assert dataset.is_dir() and not (tmp_path / "result" / "_staging" / job["name"]).exists()
    events = tx_env.events("DecidedOrders")
    assert {m.transaction_id for m in events} == set(job["member_ids"])
    assert_events_are_the_dataset(events, dataset, job["name"])
