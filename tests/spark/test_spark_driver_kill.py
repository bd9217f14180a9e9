"""A driver SIGKILLed between its tasks' completion and its commit (the driver, its JVM and its Python
workers, as a lost driver pod would be): check-back resolves the job from the ledger, so either
nothing of it is ever visible or, if its decision was recorded, all of it, once."""

from __future__ import annotations

import pytest

from spark_helpers import assert_published_once, kill_group, spawn_driver, wait_marker

pytest.importorskip("pyspark.sql.datasource")
pytestmark = pytest.mark.timeout(600)  # each test starts its own Spark driver(s)

from txbroker_spark import Ledger  # noqa: E402

ROWS = 200
TXIDS = 20  # 2 partitions x 100 rows / 10 per transaction


def run_until_hook(env, tmp_path, topic, hang_at, *opts, driver_env=None):
    """Run a driver to its hook and SIGKILL it there; returns (job, ids pending at the hook)."""
    marker = tmp_path / "hook.json"
    log = tmp_path / "driver.log"
    extra = [a for o in opts for a in ("--opt", o)]
    proc = spawn_driver("batch", "--brokers", env.brokers, "--topic", topic, "--group", env.group,
                        "--ledger", str(env.ledger), "--rows", str(ROWS), "--partitions", "2",
                        "--opt", f"inject.hangAt={hang_at}", "--opt", f"inject.markerFile={marker}", *extra,
                        log_path=log, env=driver_env)
    try:
        hook = wait_marker(marker, proc, log)
        # Taken while the driver still lives: once it is killed, check-back may resolve any of them.
        pending = {t["transaction_id"] for t in env.pending()}
    finally:
        kill_group(proc)
    assert hook["txids"] == TXIDS
    jobs = Ledger(env.ledger).jobs()
    assert len(jobs) == 1
    return jobs[0], pending


def assert_rolled_back_by_checkback(env, job, topic):
    env.wait_settled()
    assert env.events(topic) == []
    answers = env.checker_answers()
    mine = [t for t in answers if t.startswith(f"{job}-")]
    assert len(mine) == TXIDS and all(answers[t][-1] == "ROLLBACK" for t in mine)
    assert all(env.transaction(t)["state"] == "ROLLED_BACK" and env.transaction(t)["by"] == "check" for t in mine)


@pytest.mark.slow
def test_driver_killed_before_its_decision_publishes_nothing(tx_env, tmp_path):
    job, pending = run_until_hook(tx_env, tmp_path, "KilledBefore", "before-decision")
    assert len(pending) == TXIDS  # all half messages stored; the driver alive: the checker said UNKNOWN
    assert_rolled_back_by_checkback(tx_env, job, "KilledBefore")  # it sees the JVM gone: ABORTED, ROLLBACK
    d = Ledger(tx_env.ledger).job_decision(job)
    assert d.decision == "ABORTED" and d.by == "checker" and "is gone" in d.reason


@pytest.mark.slow
def test_driver_on_another_host_is_rolled_back_at_its_deadline(tx_env, tmp_path):
    """As on Kubernetes: the driver ran elsewhere (its start record names another host), so the
    checker cannot tell it died; the job's deadline (3 s) decides: ABORTED, every transaction rolled
    back, nothing visible."""
    job, _ = run_until_hook(tx_env, tmp_path, "KilledElsewhere", "before-decision", "deadlineSeconds=3",
                            driver_env={"TXBROKER_DRIVER_HOST": "orders-driver-pod-7f9c"})
    led = Ledger(tx_env.ledger)
    start = led.job_start(job)
    assert start["driver"]["host"] == "orders-driver-pod-7f9c" and start["deadline_ms"] == 3000
    assert_rolled_back_by_checkback(tx_env, job, "KilledElsewhere")
    d = led.job_decision(job)
    assert d.decision == "ABORTED" and d.by == "checker" and "deadline 3s" in d.reason, d
    assert "is gone" not in d.reason
    assert d.decided_ms - start["created_ms"] >= 3000  # not before the deadline


@pytest.mark.slow
def test_driver_killed_after_its_decision_publishes_everything_once(tx_env, tmp_path):
    job, pending = run_until_hook(tx_env, tmp_path, "KilledAfter", "after-decision")
    d = Ledger(tx_env.ledger).job_decision(job)
    assert d.committed and d.by == "driver" and len(d.txids) == TXIDS
    assert pending <= set(d.txids)  # the checker may have committed some already, nothing else pending
    tx_env.wait_settled()  # the checker commits them at check-back
    events = tx_env.events("KilledAfter")
    assert_published_once(events, range(ROWS))
    assert {m.transaction_id for m in events} == set(d.txids)
    assert all(tx_env.transaction(t)["by"] == "check" for t in d.txids)
