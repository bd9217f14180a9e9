"""A driver SIGKILLed between its tasks' completion and its commit (the driver, its JVM and its Python
workers, as a lost driver pod would be): check-back resolves the job from the ledger, so either
nothing of it is ever visible or, if its decision was recorded, all of it, once."""

from __future__ import annotations

import pytest

from spark_helpers import bodies_by_id, kill_group, spawn_driver, wait_marker

pytest.importorskip("pyspark.sql.datasource")
pytestmark = pytest.mark.timeout(600)  # each test starts its own Spark driver(s)

from txbroker_spark import Ledger  # noqa: E402

ROWS = 200


def run_until_hook(env, tmp_path, topic, hang_at):
    marker = tmp_path / "hook.json"
    log = tmp_path / "driver.log"
    proc = spawn_driver("batch", "--brokers", env.brokers, "--topic", topic, "--group", env.group,
                        "--ledger", str(env.ledger), "--rows", str(ROWS), "--partitions", "2",
                        "--opt", f"inject.hangAt={hang_at}", "--opt", f"inject.markerFile={marker}", log_path=log)
    try:
        hook = wait_marker(marker, proc, log)
    finally:
        kill_group(proc)
    assert hook["txids"] == 20  # 2 partitions x 100 rows / 10 per transaction
    jobs = Ledger(env.ledger).jobs()
    assert len(jobs) == 1
    return jobs[0]


@pytest.mark.slow
def test_driver_killed_before_its_decision_publishes_nothing(tx_env, tmp_path):
    job = run_until_hook(tx_env, tmp_path, "KilledBefore", "before-decision")
    assert len(tx_env.pending()) == 20  # all half messages stored, none decided
    tx_env.wait_settled()  # the checker sees the driver's JVM gone: ABORTED, then ROLLBACK each
    d = Ledger(tx_env.ledger).job_decision(job)
    assert d.decision == "ABORTED" and d.by == "checker" and "is gone" in d.reason
    assert tx_env.events("KilledBefore") == []
    assert set(tx_env.checker_answers()) and all(a[-1] == "ROLLBACK" for a in tx_env.checker_answers().values())


@pytest.mark.slow
def test_driver_killed_after_its_decision_publishes_everything_once(tx_env, tmp_path):
    job = run_until_hook(tx_env, tmp_path, "KilledAfter", "after-decision")
    d = Ledger(tx_env.ledger).job_decision(job)
    assert d.committed and d.by == "driver" and len(d.txids) == 20
    tx_env.wait_settled()  # the checker commits them at check-back
    events = tx_env.events("KilledAfter")
    counts = bodies_by_id(events)
    assert len(events) == ROWS and sorted(counts) == list(range(ROWS)) and set(counts.values()) == {1}
    assert {m.transaction_id for m in events} == set(d.txids)
    assert all(tx_env.transaction(t)["by"] == "check" for t in d.txids)
