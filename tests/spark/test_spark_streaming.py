"""Structured Streaming: each micro-batch commits atomically, and a query SIGKILLed mid-batch and
restarted from its checkpoint publishes every batch exactly once."""

from __future__ import annotations

import pytest

from spark_helpers import assert_published_once, kill_group, run_driver, spawn_driver, wait_marker, wait_until, \
    write_input_files

pytest.importorskip("pyspark.sql.datasource")
pytestmark = pytest.mark.timeout(600)  # each test starts its own Spark driver(s)

from txbroker_spark import Ledger  # noqa: E402

FILES, PER_FILE = 4, 25  # four micro-batches of 25 rows (one input file per trigger)


def stream_args(env, tmp_path, topic, *opts):
    args = ["stream", "--brokers", env.brokers, "--topic", topic, "--group", env.group, "--ledger", str(env.ledger),
            "--input", str(tmp_path / "input"), "--checkpoint", str(tmp_path / "checkpoint")]
    for o in opts:
        args += ["--opt", o]
    return args


def query_dir(env):
    queries = list((env.ledger / "streams").iterdir())
    assert len(queries) == 1
    return queries[0].name


def assert_each_row_once(env, topic, ids):
    env.wait_settled()
    events = env.events(topic)
    assert_published_once(events, ids)
    return events


def committed_batches(env, query) -> dict[int, object]:
    led = Ledger(env.ledger)
    return {b: led.committed_batch(query, b) for b in range(FILES)}


def test_streaming_batches_commit_atomically(tx_env, tmp_path):
    ids = write_input_files(tmp_path / "input", FILES, PER_FILE)
    run_driver(*stream_args(tx_env, tmp_path, "Stream"), log_path=tmp_path / "driver.log")
    events = assert_each_row_once(tx_env, "Stream", ids)
    query = query_dir(tx_env)
    batches = committed_batches(tx_env, query)
    assert all(batches[b] is not None and batches[b][1].rows == PER_FILE for b in range(FILES))
    by_batch = {}
    for m in events:
        by_batch.setdefault(m.properties["SPARK_BATCH_ID"], set()).add(m.transaction_id)
    assert {int(b): txids for b, txids in by_batch.items()} == {b: set(batches[b][1].txids) for b in range(FILES)}


def test_streaming_task_retry_reuses_its_transactions(tx_env, tmp_path):
    """The first attempt of each batch's task crashes after sending; the retry sends the same rows,
    so the same transaction ids: the broker stores nothing new (duplicates) and the batch commits once."""
    ids = write_input_files(tmp_path / "input", FILES, PER_FILE)
    run_driver(*stream_args(tx_env, tmp_path, "Retried", "inject.failPartition=0", "inject.failMode=crash"),
               log_path=tmp_path / "driver.log")
    assert_each_row_once(tx_env, "Retried", ids)
    batches = committed_batches(tx_env, query_dir(tx_env))
    for b in range(FILES):
        _epoch, d = batches[b]
        assert d.attempts[0]["attempt_number"] == 1 and d.duplicates == len(d.txids) == 3  # 25 rows / 10
    assert tx_env.metric("txbroker_messages_sent_total", 'kind="half"') == FILES * PER_FILE


@pytest.mark.slow
def test_query_killed_after_its_decision_and_restarted_publishes_once(tx_env, tmp_path):
    """Killed after batch 1's decision, before its ENDs and before Spark's commit log: the restarted
    query replays batch 1 with the same transaction ids (the broker stores nothing new: duplicates),
    finds it decided in the ledger, and only re-sends the idempotent commits."""
    ids = write_input_files(tmp_path / "input", FILES, PER_FILE)
    marker = tmp_path / "hook.json"
    log = tmp_path / "driver-1.log"
    proc = spawn_driver(*stream_args(tx_env, tmp_path, "Replay", "inject.hangAt=after-decision",
                                     "inject.hangBatch=1", f"inject.markerFile={marker}"), log_path=log)
    try:
        assert wait_marker(marker, proc, log)["batch"] == 1
    finally:
        kill_group(proc)
    query = query_dir(tx_env)
    first = committed_batches(tx_env, query)
    assert first[0] and first[1] and not first[2]
    stored_before = tx_env.metric("txbroker_messages_sent_total", 'kind="half"')
    assert stored_before == 2 * PER_FILE

    run_driver(*stream_args(tx_env, tmp_path, "Replay"), log_path=tmp_path / "driver-2.log")
    assert_each_row_once(tx_env, "Replay", ids)
    after = committed_batches(tx_env, query)
    assert after[1] == first[1]  # the replay recorded nothing new for batch 1
    # batches 2 and 3 stored 50 more half messages; the replay of batch 1 stored none
    assert tx_env.metric("txbroker_messages_sent_total", 'kind="half"') == FILES * PER_FILE
    assert "was already committed" in (tmp_path / "driver-2.log").read_text()


@pytest.mark.slow
def test_query_killed_before_its_decision_is_rolled_back_then_republished(tx_env, tmp_path):
    """Killed before batch 1's decision: the checker sees the query's driver gone and aborts batch 1
    (rolling back its half messages, bumping the query's epoch); the restarted query replays batch 1
    under the new epoch and commits it; every row arrives once."""
    ids = write_input_files(tmp_path / "input", FILES, PER_FILE)
    marker = tmp_path / "hook.json"
    log = tmp_path / "driver-1.log"
    proc = spawn_driver(*stream_args(tx_env, tmp_path, "Abandoned", "inject.hangAt=before-decision",
                                     "inject.hangBatch=1", f"inject.markerFile={marker}"), log_path=log)
    try:
        wait_marker(marker, proc, log)
    finally:
        kill_group(proc)
    query = query_dir(tx_env)
    led = Ledger(tx_env.ledger)
    wait_until(lambda: led.batch_decision(query, 1, 0), 90, 0.2, "the checker to abort batch 1")
    assert led.batch_decision(query, 1, 0).decision == "ABORTED" and led.stream_epoch(query) == 1
    tx_env.wait_settled()
    assert_published_once(tx_env.events("Abandoned"), ids[:PER_FILE])  # only batch 0 so far

    run_driver(*stream_args(tx_env, tmp_path, "Abandoned"), log_path=tmp_path / "driver-2.log")
    assert_each_row_once(tx_env, "Abandoned", ids)
    epoch, d = led.committed_batch(query, 1)
    assert epoch == 1 and d.rows == PER_FILE
