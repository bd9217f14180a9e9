"""Speculative execution on: a slow attempt and its speculative copy both send their half messages;
only the attempt Spark keeps is in the job's decision, the other is rolled back by the broker when
it records it. And an executor JVM SIGKILLed mid-write: Spark reruns its task elsewhere; the lost
attempt's half messages are rolled back the same way.

Spark never runs a speculative copy on the host of the original attempt, so local[*] and
local-cluster (one host) cannot speculate. This test starts a small standalone cluster instead: a
master and two workers (one core each) on two loopback addresses, 127.0.0.2 and 127.0.0.3, which
Spark takes for two hosts.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from spark_helpers import assert_published_once, free_port_unused, kill_group, run_driver, spawn_driver, \
    wait_marker
from support.waiting import wait_until

pytest.importorskip("pyspark.sql.datasource")


ROWS, PARTITIONS, SLOW = 120, 4, 1


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


@pytest.fixture
def standalone(tmp_path):
    """spark://127.0.0.1:PORT with workers on 127.0.0.2 and 127.0.0.3."""
    import pyspark

    port = free_port_unused()
    env = {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent), "SPARK_DAEMON_MEMORY": "256m",
           "SPARK_DAEMON_JAVA_OPTS": "-Dspark.master.rest.enabled=false -Dspark.ui.enabled=false"}
    procs = []

    def launch(name, *args):
        log = open(tmp_path / f"{name}.log", "ab")
        procs.append(subprocess.Popen([_spark_class(), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True))
        log.close()

    master = f"spark://127.0.0.1:{port}"
    launch("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
           "--webui-port", str(free_port_unused()))
    for i in (2, 3):
        launch(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", f"127.0.0.{i}", "--cores", "1",
               "--memory", "1g", "--webui-port", "0", "--work-dir", str(tmp_path / f"work{i}"), master)

    def registered():
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a standalone daemon exited: {(tmp_path / 'master.log').read_text()[-2000:]}")
        return (tmp_path / "master.log").read_text(errors="replace").count("Registering worker") >= 2

    try:
        wait_until(registered, 180, "two Spark workers to register with the master")
        yield master
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 15)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait(10)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_speculative_duplicate_never_publishes_twice(tx_env, standalone, tmp_path):
    conf = {"spark.speculation": "true", "spark.speculation.interval": "100ms", "spark.speculation.multiplier": "1.5",
            "spark.speculation.quantile": "0.5", "spark.speculation.minTaskRuntime": "500ms",
            "spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "2",
            "spark.locality.wait": "0s"}
    # The slow original never finishes first: it sleeps far longer than the test may run, until Spark
    # kills it once the speculative copy has won (or the application ends). So the copy wins however
    # long the loaded machine takes to launch it; if Spark never speculated, the driver times out.
    marker = tmp_path / "slow.json"  # the slow original writes its transaction ids here once sent
    args = ["batch", "--master", standalone, "--brokers", tx_env.brokers, "--topic", "Speculative",
            "--group", tx_env.group, "--rows", str(ROWS),
            "--partitions", str(PARTITIONS), "--opt", f"inject.slowPartition={SLOW}",
            "--opt", "inject.slowSeconds=3600", "--opt", f"inject.markerFile={marker}"]
    for k, v in conf.items():
        args += ["--conf", f"{k}={v}"]
    run_driver(*args, log_path=tmp_path / "driver.log", timeout=420)

    job = tx_env.only_job()
    assert job["state"] == "COMMITTED"
    events = tx_env.events("Speculative")
    assert_published_once(events, range(ROWS))
    assert {m.transaction_id for m in events} == set(job["member_ids"])
    # The slow original sent its half messages too; the decision does not name them, so the broker
    # rolled them back when it recorded it: the speculative copy won. (On a loaded machine the copy
    # can win before the original even sent: Spark kills it then, and it announced nothing; CI saw it.)
    losers = json.loads(marker.read_text())["txids"] if marker.exists() else []
    assert len(losers) in (0, ROWS // PARTITIONS // 10) and not set(losers) & set(job["member_ids"]), losers
    tx_env.wait_settled()
    if losers:   # (none when the copy won before the original sent)
        assert {(tx_env.transaction(t)["state"], tx_env.transaction(t)["by"]) for t in losers} == {("ROLLED_BACK", "job")}


def _executor_jvm(python_pid: int) -> int:
    """The executor JVM above a Python worker (its parent chain: worker, daemon, java)."""
    pid = python_pid
    for _ in range(6):
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        if stat[stat.index("(") + 1:stat.rindex(")")] == "java":
            return pid
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    raise AssertionError(f"no java process above {python_pid}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_executor_lost_mid_write_never_publishes_twice(tx_env, standalone, tmp_path):
    marker, log = tmp_path / "slow.json", tmp_path / "driver.log"
    args = ["batch", "--master", standalone, "--brokers", tx_env.brokers, "--topic", "ExecutorLost",
            "--group", tx_env.group, "--rows", str(ROWS),
            "--partitions", str(PARTITIONS), "--opt", f"inject.slowPartition={SLOW}", "--opt", "inject.slowSeconds=300",
            "--opt", f"inject.markerFile={marker}"]
    for k, v in {"spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "2"}.items():
        args += ["--conf", f"{k}={v}"]
    proc = spawn_driver(*args, log_path=log)
    try:
        hook = wait_marker(marker, proc, log)  # the slow attempt has stored its half messages
        lost = set(hook["txids"])
        assert len(lost) == ROWS // PARTITIONS // 10
        executor = _executor_jvm(hook["pid"])
        os.kill(executor, 9)  # the executor dies mid-write; Spark reruns the task on the other one
        assert proc.wait(300) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            kill_group(proc)
    job = tx_env.only_job()
    assert job["state"] == "COMMITTED" and not lost & set(job["member_ids"])
    tx_env.wait_settled()
    events = tx_env.events("ExecutorLost")
    assert_published_once(events, range(ROWS))
    assert all(tx_env.transaction(t)["state"] == "ROLLED_BACK" for t in lost)
