"""A driver SIGKILLed (the driver, its JVM and its Python workers, as a lost driver pod would be) or
paused between its tasks' completion and its commit. The broker holds the job: before the decision
it aborts the job at its deadline, after it it publishes every member, once; a driver paused past its
deadline and resumed cannot commit. No checker process, no ledger."""

from __future__ import annotations

import os
import signal

import pytest

from spark_helpers import assert_published_once, kill_group, spawn_driver, wait_marker
from support.waiting import wait_until

pytest.importorskip("pyspark.sql.datasource")
pytestmark = pytest.mark.timeout(600)  # each test starts its own Spark driver(s)

ROWS = 200
TXIDS = 20  # 2 partitions x 100 rows / 10 per transaction
DEADLINE = "deadlineSeconds=15"  # enough to reach the hook; short enough to wait for


def start_to_hook(env, tmp_path, topic, hang_at, *opts):
    """Start a driver and wait until it reaches its hook; returns (process, job, ids pending there)."""
    marker = tmp_path / "hook.json"
    log = tmp_path / "driver.log"
    extra = [a for o in opts for a in ("--opt", o)]
    proc = spawn_driver("batch", "--brokers", env.brokers, "--topic", topic, "--group", env.group,
                        "--rows", str(ROWS), "--partitions", "2",
                        "--opt", f"inject.hangAt={hang_at}", "--opt", f"inject.markerFile={marker}", *extra,
                        log_path=log)
    try:
        hook = wait_marker(marker, proc, log)
        pending = {t["transaction_id"] for t in env.pending()}
    except BaseException:
        kill_group(proc)
        raise
    assert hook["txids"] == TXIDS
    (job,) = env.jobs()
    return proc, job, pending


def assert_rolled_back_at_the_deadline(env, job_id, topic):
    job = env.wait_job(lambda j: j["state"] == "ABORTED", 60, "the broker to abort the job at its deadline")
    assert (job["job_id"], job["by"]) == (job_id, "deadline")
    assert job["decided_ms"] >= job["deadline_ms"]
    env.wait_settled()
    assert env.events(topic) == []
    return job


@pytest.mark.slow
def test_driver_killed_before_its_decision_is_rolled_back_by_the_broker_at_the_deadline(tx_env, tmp_path):
    proc, job, pending = start_to_hook(tx_env, tmp_path, "KilledBefore", "before-decision", DEADLINE)
    kill_group(proc)
    assert len(pending) == TXIDS and job["state"] == "OPEN"  # all half messages stored, nothing decided
    assert_rolled_back_at_the_deadline(tx_env, job["job_id"], "KilledBefore")
    states = {(tx_env.transaction(t)["state"], tx_env.transaction(t)["by"]) for t in pending}
    assert states == {("ROLLED_BACK", "job")}
    assert all(tx_env.transaction(t)["checks"] == 0 for t in pending)  # never checked back


@pytest.mark.slow
def test_a_driver_paused_past_its_deadline_cannot_commit_when_it_resumes(tx_env, tmp_path):
    """The zombie driver: SIGSTOPped at its commit, the broker aborts the job at the deadline; resumed,
    the driver's commit is refused naming the abort, and nothing is visible."""
    proc, job, _pending = start_to_hook(tx_env, tmp_path, "Zombie", "before-decision", DEADLINE)
    try:
        os.killpg(proc.pid, signal.SIGSTOP)
        assert_rolled_back_at_the_deadline(tx_env, job["job_id"], "Zombie")
        os.killpg(proc.pid, signal.SIGCONT)
        (tmp_path / "hook.json.release").write_text("go")
        code = proc.wait(120)
    finally:
        kill_group(proc)
    out = (tmp_path / "driver.log").read_text(errors="replace")
    assert code != 0 and "BATCH DONE" not in out
    assert "refused the commit" in out and "ABORTED" in out, out[-3000:]
    assert tx_env.events("Zombie") == []
    assert tx_env.job(job["job_id"])["state"] == "ABORTED"


@pytest.mark.slow
def test_driver_killed_after_its_decision_publishes_everything_once(tx_env, tmp_path):
    proc, _job, pending = start_to_hook(tx_env, tmp_path, "KilledAfter", "after-decision")
    kill_group(proc)
    job = tx_env.only_job()
    assert (job["state"], job["by"], job["members"]) == ("COMMITTED", "client", TXIDS)
    assert pending <= set(job["member_ids"])  # the broker may have ended some already, nothing else pending
    wait_until(lambda: tx_env.job(job["job_id"])["resolved"], 60, "the broker to end every member")
    events = tx_env.events("KilledAfter")
    assert_published_once(events, range(ROWS))
    assert {m.transaction_id for m in events} == set(job["member_ids"])
    assert all(tx_env.transaction(t)["by"] == "job" for t in job["member_ids"])
