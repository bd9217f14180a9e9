"""Batch writes against a real broker and a real ledger checker: exactly once under injected failures.

Each test compares what a consumer reads with the dataset that was committed: same count, same
content, every row once, nothing from an attempt Spark discarded, nothing left pending.
"""

from __future__ import annotations

import json

import pytest

from spark_helpers import bodies_by_id

pytest.importorskip("pyspark.sql.datasource")

from txbroker_spark import DeferredJob, Ledger  # noqa: E402
from txbroker_spark.datasource import new_job_id  # noqa: E402
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


def only_decision(env) -> tuple[str, object]:
    led = Ledger(env.ledger)
    jobs = led.jobs()
    assert len(jobs) == 1, jobs
    return jobs[0], led.job_decision(jobs[0])


def assert_exactly_the_dataset(env, topic, n=ROWS):
    env.wait_settled()
    events = env.events(topic)
    counts = bodies_by_id(events)
    assert len(events) == n and set(counts) == set(range(n)) and max(counts.values()) == 1
    assert bodies(events) == [order_row(i) for i in range(n)]
    job, d = only_decision(env)
    assert d.committed and all(m.transaction_id in set(d.txids) for m in events)
    assert {m.properties[P_JOB] for m in events} == {job}
    return events, job, d


def test_write_then_read_back_with_spark(spark, tx_env):
    save(orders(spark), tx_env, "Plain", keyColumn="order_id", tagsColumn="region", batchSize=25)
    events, job, d = assert_exactly_the_dataset(tx_env, "Plain")
    assert d.rows == ROWS and len(d.txids) == 6 and d.by == "driver"  # 3 partitions x ceil(40/25)
    assert {(m.keys, m.tags) for m in events} == {(f"order-{i}", str(i % 7)) for i in range(ROWS)}

    df = spark.read.format("txbroker").option("brokers", tx_env.brokers).option("topic", "Plain").load()
    assert df.columns == ["topic", "queue_id", "queue_offset", "msg_id", "key", "tags", "body", "born_timestamp",
                          "transaction_id", "properties"]
    rows = df.collect()
    assert sorted(json.loads(r.body)["id"] for r in rows) == list(range(ROWS))
    assert {r.transaction_id for r in rows} == set(d.txids)
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


def test_body_from_a_column_as_bytes_or_string(spark, tx_env):
    df = orders(spark, 30, 2).selectExpr("id", "order_id", "binary(concat('payload-', id)) AS raw")
    save(df, tx_env, "Raw", bodyColumn="raw", keyColumn="order_id")
    save(df, tx_env, "Text", bodyColumn="order_id")
    tx_env.wait_settled()
    assert sorted(m.body for m in tx_env.events("Raw")) == sorted(f"payload-{i}".encode() for i in range(30))
    assert sorted(m.body for m in tx_env.events("Text")) == sorted(f"order-{i}".encode() for i in range(30))


def test_retried_task_after_crash_publishes_once(spark, tx_env):
    """Attempt 0 of partition 1 sends its half messages, then its Python worker dies (an executor lost
    mid-write). Spark retries it; only the retry's transactions are in the decision; check-back
    rolls the dead attempt's back from the ledger."""
    save(orders(spark), tx_env, "Crash", batchSize=10, **{"inject.failPartition": 1, "inject.failMode": "crash"})
    events, job, d = assert_exactly_the_dataset(tx_env, "Crash")
    kept = {a["partition"]: a for a in d.attempts}
    assert kept[1]["attempt_number"] >= 1 and kept[0]["attempt_number"] == 0
    answers = tx_env.checker_answers()
    discarded = [t for t in answers if t.startswith(f"{job}-p1-") and t not in set(d.txids)]
    assert len(discarded) == 4  # 40 rows / 10 per transaction, from the crashed attempt
    for t in discarded:
        assert answers[t][-1] == "ROLLBACK"
        tx = tx_env.transaction(t)
        assert tx["state"] == "ROLLED_BACK" and tx["by"] == "check"
    assert not {m.properties[P_ATTEMPT] for m in events if m.properties[P_PARTITION] == "1"} & \
        {t.split("-t")[1].split("-")[0] for t in discarded}


def test_retried_task_after_exception_rolls_back_its_own(spark, tx_env):
    """A task that raises after sending rolls back its own half messages before it fails."""
    save(orders(spark), tx_env, "Raise", batchSize=10, **{"inject.failPartition": 2, "inject.failMode": "raise"})
    events, job, d = assert_exactly_the_dataset(tx_env, "Raise")
    assert {a["partition"]: a["attempt_number"] for a in d.attempts}[2] >= 1


def test_failed_job_aborts_and_publishes_nothing(spark, tx_env):
    """Every attempt of partition 0 fails: the job fails, abort() records ABORTED, and every half
    message (the failed attempts' and the other partitions' good ones) ends rolled back."""
    with pytest.raises(Exception) as e:
        save(orders(spark), tx_env, "Abort", batchSize=10, **{"inject.failPartition": 0, "inject.failMode": "always"})
    assert "inject.failPartition=0" in str(e.value)
    tx_env.wait_settled()
    assert tx_env.events("Abort") == []
    job, d = only_decision(tx_env)
    assert d.decision == "ABORTED" and d.by == "driver"


def test_deferred_commit_runs_a_local_transaction_in_between(spark, tx_env, tmp_path):
    job = new_job_id("t")
    save(orders(spark, 50, 2), tx_env, "Deferred", jobId=job, commit="deferred", batchSize=10)
    d = DeferredJob(str(tx_env.ledger), tx_env.brokers, tx_env.group, job)
    assert d.rows == 50 and len(d.txids) == 6  # 2 partitions x ceil(25/10)
    assert tx_env.events("Deferred") == []  # nothing visible before the decision
    assert len(tx_env.pending()) == 6
    d.decide(commit=True, reason="local transaction done")
    report = d.publish()
    assert report.acknowledged == 6 and not report.undelivered
    assert report.acknowledged == d.publish().already  # idempotent
    assert bodies(tx_env.events("Deferred")) == [order_row(i) for i in range(50)]

    job2 = new_job_id("t")
    save(orders(spark, 20, 2), tx_env, "Deferred", jobId=job2, commit="deferred", batchSize=10)
    d2 = DeferredJob(str(tx_env.ledger), tx_env.brokers, tx_env.group, job2)
    d2.decide(commit=False, reason="local transaction failed")
    d2.publish()
    tx_env.wait_settled()
    assert bodies(tx_env.events("Deferred")) == [order_row(i) for i in range(50)]
