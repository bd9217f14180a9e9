"""The Spark data source's failure hooks (txbroker_spark/faults.py), without Spark: inert unless an
inject.* option asks, and each fires only where and when it was asked to."""

from __future__ import annotations

import json
import threading

import pytest

from txbroker_spark.faults import FaultPlan


def test_an_empty_plan_does_nothing(tmp_path):
    plan = FaultPlan()
    plan.after_send(0, 0, ["t"])
    plan.at_point("before-decision", None, {})
    plan.at_point("after-decision", 3, {})


def test_fail_partition_raises_in_the_first_attempt_only_unless_always():
    raising = FaultPlan(fail_partition=1, fail_mode="raise")
    raising.after_send(0, 0, ["t"])  # another partition
    with pytest.raises(RuntimeError, match="inject.failPartition=1: attempt 0 fails after sending 2"):
        raising.after_send(1, 0, ["a", "b"])
    raising.after_send(1, 1, ["a"])  # the retry goes through
    with pytest.raises(RuntimeError, match="attempt 3"):
        FaultPlan(fail_partition=1, fail_mode="always").after_send(1, 3, [])


def test_slow_partition_announces_what_it_stored_then_sleeps(tmp_path):
    marker = tmp_path / "slow.json"
    FaultPlan(slow_partition=2, slow_seconds=0.01, marker_file=str(marker)).after_send(2, 0, ["a", "b"])
    doc = json.loads(marker.read_text())
    assert (doc["at"], doc["partition"], doc["txids"]) == ("slow", 2, ["a", "b"])


def test_hang_fires_at_its_point_and_batch_and_is_released_by_the_file(tmp_path):
    marker = tmp_path / "hook.json"
    plan = FaultPlan(hang_at="after-decision", hang_batch=1, marker_file=str(marker))
    plan.at_point("before-decision", 1, {})  # another point
    plan.at_point("after-decision", 0, {})  # another micro-batch
    assert not marker.exists()

    done = threading.Event()
    t = threading.Thread(target=lambda: (plan.at_point("after-decision", 1, {"job": "j"}), done.set()))
    t.start()
    try:
        for _ in range(100):
            if marker.exists():
                break
            done.wait(0.05)
        assert json.loads(marker.read_text())["job"] == "j" and not done.is_set()
    finally:
        (tmp_path / "hook.json.release").write_text("go")
        t.join(10)
    assert done.is_set()
    # a batch write (no micro-batch) hangs whatever hangBatch says
    (tmp_path / "hook.json").unlink()
    plan.at_point("after-decision", None, {"job": "b"})
    assert json.loads(marker.read_text())["job"] == "b"
