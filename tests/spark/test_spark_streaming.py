"""Structured Streaming: each micro-batch is one broker job and commits atomically, and a query
SIGKILLed mid-batch and restarted from its checkpoint publishes every batch exactly once."""

from __future__ import annotations

import pytest

from spark_helpers import assert_published_once, kill_group, run_driver, spawn_driver, wait_marker, write_input_files

pytest.importorskip("pyspark.sql.datasource")
pytestmark = pytest.mark.timeout(600)  # each test starts its own Spark driver(s)

FILES, PER_FILE = 4, 25  # four micro-batches of 25 rows (one input file per trigger)


def stream_args(env, tmp_path, topic, *opts):
    args = ["stream", "--brokers", env.brokers, "--topic", topic, "--group", env.group,
            "--input", str(tmp_path / "input"), "--checkpoint", str(tmp_path / "checkpoint")]
    for o in opts:
        args += ["--opt", o]
    return args


def batch_jobs(env, state: str = "COMMITTED") -> dict[int, dict]:
    """batch id -> its job in `state` (jobs are named <query>.b<batch>), with member ids."""
    out = {}
    for j in env.jobs():
        if j["state"] == state:
            out[int(j["name"].rsplit(".b", 1)[1])] = env.job(j["job_id"])
    return out


def assert_each_row_once(env, topic, ids):
    env.wait_settled()
    events = env.events(topic)
    assert_published_once(events, ids)
    return events


def test_streaming_batches_commit_atomically(tx_env, tmp_path):
    ids = write_input_files(tmp_path / "input", FILES, PER_FILE)
    run_driver(*stream_args(tx_env, tmp_path, "Stream"), log_path=tmp_path / "driver.log")
    events = assert_each_row_once(tx_env, "Stream", ids)
    batches = batch_jobs(tx_env)
    assert sorted(batches) == list(range(FILES)) and len(tx_env.jobs()) == FILES
    by_batch = {}
    for m in events:
        by_batch.setdefault(m.properties["SPARK_BATCH_ID"], set()).add(m.transaction_id)
    assert {int(b): txids for b, txids in by_batch.items()} == {b: set(batches[b]["member_ids"]) for b in range(FILES)}


def test_streaming_over_broker_groups_commits_each_batch_as_one_job_on_every_group(cluster_env, tmp_path):
    """A query writing to a TxBroker of two groups: each micro-batch's rows spread over both, each
    batch one job decided at its home and followed by the other group, every row once."""
    ids = write_input_files(tmp_path / "input", FILES, PER_FILE)
    run_driver(*stream_args(cluster_env, tmp_path, "StreamSpread", "batchSize=5"), log_path=tmp_path / "driver.log")
    assert_each_row_once(cluster_env, "StreamSpread", ids)
    located = cluster_env.located("StreamSpread")
    assert {g for g, _m in located} == {"g0", "g1"}, located
    homes = cluster_env.homes()
    assert sorted(int(j["name"].rsplit(".b", 1)[1]) for j in homes) == list(range(FILES))
    assert all((j["state"], j["resolved"]) == ("COMMITTED", True) for j in homes), homes
    for j in homes:  # each batch's rows on the other group are the members its home kept there
        other = "g1" if j["at"] == "g0" else "g0"
        mine = {m.transaction_id for g, m in located if g == other and m.properties["SPARK_BATCH_ID"] ==
                j["name"].rsplit(".b", 1)[1]}
        assert mine == set(j["remote_member_ids"].get(other, [])), (j["name"], mine)


def test_streaming_task_retry_reuses_its_transactions(tx_env, tmp_path):
    """The first attempt of each batch's task crashes after sending; the retry sends the same rows,
    so the same transaction ids: the broker stores nothing new (duplicates) and the batch commits once."""
    ids = write_input_files(tmp_path / "input", FILES, PER_FILE)
    run_driver(*stream_args(tx_env, tmp_path, "Retried", "inject.failPartition=0", "inject.failMode=crash"),
               log_path=tmp_path / "driver.log")
    assert_each_row_once(tx_env, "Retried", ids)
    batches = batch_jobs(tx_env)
    assert all(batches[b]["members"] == 3 for b in range(FILES))  # 25 rows / 10
    assert tx_env.metric("txbroker_messages_sent_total", 'kind="half"') == FILES * PER_FILE


@pytest.mark.slow
def test_query_killed_after_its_decision_and_restarted_publishes_once(tx_env, tmp_path):
    """Killed right after batch 1's decision, before Spark's commit log: the restarted query replays
    batch 1, finds its job committed (its tasks send nothing), and records nothing new."""
    ids = write_input_files(tmp_path / "input", FILES, PER_FILE)
    marker = tmp_path / "hook.json"
    log = tmp_path / "driver-1.log"
    proc = spawn_driver(*stream_args(tx_env, tmp_path, "Replay", "inject.hangAt=after-decision",
                                     "inject.hangBatch=1", f"inject.markerFile={marker}"), log_path=log)
    try:
        assert ".b1." in wait_marker(marker, proc, log)["job"]
    finally:
        kill_group(proc)
    first = batch_jobs(tx_env)
    assert sorted(first) == [0, 1]
    stored_before = tx_env.metric("txbroker_messages_sent_total", 'kind="half"')
    assert stored_before == 2 * PER_FILE

    run_driver(*stream_args(tx_env, tmp_path, "Replay"), log_path=tmp_path / "driver-2.log")
    assert_each_row_once(tx_env, "Replay", ids)
    after = batch_jobs(tx_env)
    assert after[1] == first[1] and len(tx_env.jobs()) == FILES  # the replay opened nothing new for batch 1
    # batches 2 and 3 stored 50 more half messages; the replay of batch 1 stored none
    assert tx_env.metric("txbroker_messages_sent_total", 'kind="half"') == FILES * PER_FILE
    assert "was already committed" in (tmp_path / "driver-2.log").read_text()


@pytest.mark.slow
def test_query_killed_before_its_decision_is_rolled_back_then_republished(tx_env, tmp_path):
    """Killed before batch 1's decision: the broker aborts batch 1's job at its deadline (rolling back
    its half messages); the restarted query replays batch 1 in a new job, with new transaction ids,
    and commits it; every row arrives once."""
    ids = write_input_files(tmp_path / "input", FILES, PER_FILE)
    marker = tmp_path / "hook.json"
    log = tmp_path / "driver-1.log"
    proc = spawn_driver(*stream_args(tx_env, tmp_path, "Abandoned", "inject.hangAt=before-decision",
                                     "inject.hangBatch=1", f"inject.markerFile={marker}", "deadlineSeconds=10"),
                        log_path=log)
    try:
        wait_marker(marker, proc, log)
    finally:
        kill_group(proc)
    aborted = tx_env.wait_job(lambda j: j["state"] == "ABORTED", 60, "the broker to abort batch 1's job")
    assert aborted["name"].endswith(".b1") and aborted["by"] == "deadline"
    tx_env.wait_settled()
    assert_published_once(tx_env.events("Abandoned"), ids[:PER_FILE])  # only batch 0 so far

    run_driver(*stream_args(tx_env, tmp_path, "Abandoned"), log_path=tmp_path / "driver-2.log")
    assert_each_row_once(tx_env, "Abandoned", ids)
    replayed = batch_jobs(tx_env)[1]
    assert replayed["name"] == aborted["name"] and replayed["job_id"] != aborted["job_id"]
    assert replayed["members"] == 3
