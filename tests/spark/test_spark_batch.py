"""Batch writes against a real broker: exactly once under injected failures, each write one job
whose decision the broker keeps and carries out (no checker, no ledger).

Each test compares what a consumer reads with the dataset that was committed: same count, same
content, every row once, nothing from an attempt Spark discarded, nothing left pending.
"""

from __future__ import annotations

import json

import pytest

from spark_helpers import bodies_by_id

pytest.importorskip("pyspark.sql.datasource")

from txbroker_spark import DeferredJob, JobAborted, new_job_id  # noqa: E402
from txbroker_spark.options import P_ATTEMPT, P_JOB, P_PARTITION  # noqa: E402

ROWS = 120


def orders(spark, n=ROWS, partitions=3):
    return spark.range(n, numPartitions=partitions).selectExpr(
        "id", "concat('order-', id) AS order_id", "cast(id % 7 AS string) AS region", "cast(id * 2.5 AS double) AS amount")


def order_row(i: int) -> dict:
    """A row of orders() as its JSON body."""
    return {"id": i, "order_id": f"order-{i}", "region": str(i % 7), "amount": i * 2.5}


def bodies(events) -> list[dict]:
    return sorted((json.loads(m.body) for m in events), key=lambda b: b["id"])


def save(df, env, topic, **opts):
    df.write.format("txbroker").options(**env.options(topic, **opts)).mode("append").save()


def assert_exactly_the_dataset(env, topic, n=ROWS):
    """Right after save(): the driver's commit returns once the broker made the decision visible."""
    events = env.events(topic)
    counts = bodies_by_id(events)
    assert len(events) == n and set(counts) == set(range(n)) and max(counts.values()) == 1
    assert bodies(events) == [order_row(i) for i in range(n)]
    job = env.only_job()
    assert (job["state"], job["by"], job["resolved"]) == ("COMMITTED", "client", True)
    assert {m.transaction_id for m in events} == set(job["member_ids"])
    assert {m.properties[P_JOB] for m in events} == {job["job_id"]}
    env.wait_settled()  # the members the decision does not keep: rolled back by the broker
    return events, job


def test_write_then_read_back_with_spark(spark, tx_env):
    save(orders(spark), tx_env, "Plain", keyColumn="order_id", tagsColumn="region", batchSize=25)
    events, job = assert_exactly_the_dataset(tx_env, "Plain")
    assert job["members"] == 6  # 3 partitions x ceil(40/25)
    assert {(m.keys, m.tags) for m in events} == {(f"order-{i}", str(i % 7)) for i in range(ROWS)}

    df = spark.read.format("txbroker").option("brokers", tx_env.brokers).option("topic", "Plain").load()
    assert df.columns == ["topic", "queue_id", "queue_offset", "msg_id", "key", "tags", "body", "born_timestamp",
                          "transaction_id", "properties"]
    rows = df.collect()
    assert sorted(json.loads(r.body)["id"] for r in rows) == list(range(ROWS))
    assert {r.transaction_id for r in rows} == set(job["member_ids"])
    # an offset range per queue: from offset 5 of queue 0 to its end, nothing else
    q0 = [r for r in rows if r.queue_id == 0]
    part = (spark.read.format("txbroker").option("brokers", tx_env.brokers).option("topic", "Plain")
            .option("queues", "0").option("startingOffsets", '{"0": 5}').load().collect())
    assert sorted(r.queue_offset for r in part) == sorted(r.queue_offset for r in q0 if r.queue_offset >= 5)
    # endingOffsets is exclusive: queue 0's offsets 2, 3, 4 and queue 1's first three, with their bodies
    q1 = [r for r in rows if r.queue_id == 1]
    assert len(q0) >= 5 and len(q1) >= 3  # 6 transactions round robin over 4 queues: 40 rows in each of these
    window = (spark.read.format("txbroker").option("brokers", tx_env.brokers).option("topic", "Plain")
              .option("queues", "0,1").option("startingOffsets", '{"0": 2}')
              .option("endingOffsets", '{"0": 5, "1": 3}').load().collect())
    assert sorted((r.queue_id, r.queue_offset, r.body) for r in window) == sorted(
        [(0, r.queue_offset, r.body) for r in q0 if 2 <= r.queue_offset < 5]
        + [(1, r.queue_offset, r.body) for r in q1 if r.queue_offset < 3])
    assert len(window) == 6
    # an end beyond what the queue holds stops at its end (as `latest` would)
    beyond = (spark.read.format("txbroker").option("brokers", tx_env.brokers).option("topic", "Plain")
              .option("queues", "0").option("endingOffsets", '{"0": 100000}').load().collect())
    assert sorted(r.queue_offset for r in beyond) == sorted(r.queue_offset for r in q0)


def test_keyed_rows_keep_their_order_per_key_within_a_transaction(spark, tx_env):
    """A member transaction goes out in queue order (the broker indexes it by runs of one queue):
    each key's rows, all on one queue, still arrive in the order the partition had them."""
    df = spark.range(90, numPartitions=1).selectExpr("id", "concat('key-', id % 7) AS k")
    save(df, tx_env, "KeyOrder", keyColumn="k", batchSize=1000)
    rows = (spark.read.format("txbroker").option("brokers", tx_env.brokers).option("topic", "KeyOrder")
            .load().collect())
    assert len({r.transaction_id for r in rows}) == 1 and len(rows) == 90
    by_key: dict[str, list] = {}
    for r in sorted(rows, key=lambda r: (r.queue_id, r.queue_offset)):
        by_key.setdefault(r.key, []).append((r.queue_id, json.loads(r.body)["id"]))
    assert len({q for rs in by_key.values() for q, _ in rs}) > 1  # the keys spread over several queues
    for key, rs in by_key.items():
        assert len({q for q, _ in rs}) == 1, f"{key} on more than one queue"
        ids = [i for _, i in rs]
        assert ids == sorted(ids) == [i for i in range(90) if f"key-{i % 7}" == key]


def test_body_from_a_column_as_bytes_or_string(spark, tx_env):
    df = orders(spark, 30, 2).selectExpr("id", "order_id", "binary(concat('payload-', id)) AS raw")
    save(df, tx_env, "Raw", bodyColumn="raw", keyColumn="order_id")
    save(df, tx_env, "Text", bodyColumn="order_id")
    assert sorted(m.body for m in tx_env.events("Raw")) == sorted(f"payload-{i}".encode() for i in range(30))
    assert sorted(m.body for m in tx_env.events("Text")) == sorted(f"order-{i}".encode() for i in range(30))


def test_retried_task_after_crash_publishes_once(spark, tx_env, tmp_path):
    """Attempt 0 of partition 1 sends its half messages, then its Python worker dies (an executor lost
    mid-write). Spark retries it; only the retry's transactions are in the decision; the broker
    rolls the dead attempt's back when it records the decision, with no check-back."""
    marker = tmp_path / "crashed.json"
    save(orders(spark), tx_env, "Crash", batchSize=10, **{"inject.failPartition": 1, "inject.failMode": "crash",
                                                          "inject.markerFile": str(marker)})
    events, job = assert_exactly_the_dataset(tx_env, "Crash")
    discarded = json.loads(marker.read_text())["txids"]  # what the crashed attempt had stored
    assert len(discarded) == 4 and not set(discarded) & set(job["member_ids"])
    for t in discarded:
        tx = tx_env.transaction(t)
        assert (tx["state"], tx["by"], tx["checks"]) == ("ROLLED_BACK", "job", 0)
    assert not {m.properties[P_ATTEMPT] for m in events if m.properties[P_PARTITION] == "1"} & \
        {t.split("-t")[1].split("-")[0] for t in discarded}


def test_retried_task_after_exception_is_rolled_back_by_the_decision(spark, tx_env):
    """A task that raises after sending: Spark retries it; its half messages are not in the decision."""
    save(orders(spark), tx_env, "Raise", batchSize=10, **{"inject.failPartition": 2, "inject.failMode": "raise"})
    events, job = assert_exactly_the_dataset(tx_env, "Raise")
    assert len({m.properties[P_ATTEMPT] for m in events if m.properties[P_PARTITION] == "2"}) == 1


def test_failed_job_aborts_and_publishes_nothing(spark, tx_env):
    """Every attempt of partition 0 fails: the job fails, abort() records ABORTED, and every half
    message (the failed attempts' and the other partitions' good ones) ends rolled back."""
    with pytest.raises(Exception) as e:
        save(orders(spark), tx_env, "Abort", batchSize=10, **{"inject.failPartition": 0, "inject.failMode": "always"})
    assert "inject.failPartition=0" in str(e.value)
    tx_env.wait_settled()
    assert tx_env.events("Abort") == []
    job = tx_env.only_job()
    assert (job["state"], job["by"]) == ("ABORTED", "client")


def test_deferred_commit_runs_a_local_transaction_in_between(spark, tx_env, tmp_path):
    job = new_job_id("t")
    save(orders(spark, 50, 2), tx_env, "Deferred", jobId=job, commit="deferred", batchSize=10)
    d = DeferredJob(tx_env.brokers, tx_env.group, job)
    prepared = d.prepared()
    assert (prepared.state, prepared.members) == ("PREPARED", 6)  # 2 partitions x ceil(25/10)
    assert tx_env.events("Deferred") == []  # nothing visible before the decision
    assert len(tx_env.pending()) == 6
    assert d.commit().state == "COMMITTED"
    assert d.wait_visible().resolved
    assert d.commit().already  # idempotent
    assert bodies(tx_env.events("Deferred")) == [order_row(i) for i in range(50)]

    job2 = new_job_id("t")
    save(orders(spark, 20, 2), tx_env, "Deferred", jobId=job2, commit="deferred", batchSize=10)
    d2 = DeferredJob(tx_env.brokers, tx_env.group, job2)
    assert d2.abort().state == "ABORTED"
    with pytest.raises(JobAborted):  # a late commit of an aborted job
        d2.commit()
    tx_env.wait_settled()
    assert bodies(tx_env.events("Deferred")) == [order_row(i) for i in range(50)]
