"""Spark at cluster scale (real brokers, Spark local mode): a write spreads over every broker group
as one job, atomic across groups; a key lands on one queue across runs; a re-run with the same
jobId never commits a mix of two runs; a read never holds part of a job; a group's master killed
mid-write leaves every row once; bad input named."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter

import pytest

from spark_helpers import GROUP, kill_group, run_driver, spawn_driver, wait_marker
from support.waiting import wait_until

pytest.importorskip("pyspark.sql.datasource")
pytestmark = pytest.mark.timeout(600)

ROWS = 200


def rows(spark, n=ROWS, partitions=4, payload="row-"):
    return spark.range(n, numPartitions=partitions).selectExpr(
        "id", f"concat('{payload}', id) AS payload", "concat('customer-', id % 17) AS customer")


def save(df, env, topic, **opts):
    df.write.format("txbroker").options(**env.options(topic, **opts)).mode("append").save()


def by_id(events) -> Counter:
    return Counter(json.loads(m.body)["id"] for m in events)


def test_a_write_spreads_over_every_group_as_one_job(spark, cluster_env):
    save(rows(spark), cluster_env, "Spread", batchSize=10, jobId="spread-1")
    located = cluster_env.located("Spread")
    events = [m for _g, m in located]
    assert by_id(events) == Counter(range(ROWS))  # every row once
    per_group = Counter(g for g, _m in located)
    # evenly: each task's batches go round the groups, so the groups differ by a batch per task at most
    assert set(per_group) == {"g0", "g1"} and abs(per_group["g0"] - per_group["g1"]) <= 10 * 4, per_group
    (home,) = cluster_env.homes()
    assert (home["name"], home["state"], home["resolved"]) == ("spread-1", "COMMITTED", True)
    other = "g1" if home["at"] == "g0" else "g0"
    assert home["groups"] == [other] and set(home["remote_member_ids"][other])
    entry = next(j for j in cluster_env.jobs() if j["home"])
    assert (entry["at"], entry["state"], entry["by"]) == (other, "COMMITTED", "home")
    assert {m.transaction_id for g, m in located if g == other} == set(entry["member_ids"])
    cluster_env.wait_settled()


def test_one_key_lands_on_one_queue_across_runs(spark, cluster_env):
    """keyColumn: the cluster's key placement (crc32 of the key over every queue of the topic on the
    groups, in route order), so a key goes to one queue, whatever the run."""
    save(rows(spark), cluster_env, "Keyed", keyColumn="customer", batchSize=10)
    save(rows(spark, payload="second-"), cluster_env, "Keyed", keyColumn="customer", batchSize=10)
    located = cluster_env.located("Keyed")
    assert len(located) == 2 * ROWS
    places: dict[str, set] = {}
    for g, m in located:
        places.setdefault(m.keys, set()).add((g, m.queue_id))
    assert all(len(p) == 1 for p in places.values()), places
    assert {g for p in places.values() for g, _q in p} == {"g0", "g1"}
    from txbroker.client import key_selector  # the cluster producers' placement puts a key there too
    from txbroker.protocol.bodies import Message

    counts = [(g.name, cluster_env.admin(g.name).get("/api/v1/topics/Keyed")["queues"]) for g in cluster_env.cluster.groups]
    total = sum(len(q) for _n, q in counts)
    for key, (place,) in places.items():
        index = key_selector(total, Message("Keyed", b"x", keys=key), None)
        for name, queues in counts:
            if index < len(queues):
                assert place == (name, index), (key, place)
                break
            index -= len(queues)


def driver_args(env, topic: str, payload: str, job_id: str) -> list[str]:
    return ["batch", "--brokers", env.brokers, "--topic", topic, "--group", env.group, "--rows", "200",
            "--partitions", "4", "--payload", payload, "--opt", f"jobId={job_id}"]


def at_decision(env, tmp_path, topic: str, payload: str, job_id: str):
    """A driver whose write stored every half message and waits at its decision: (process, its log)."""
    marker, log = tmp_path / "hook.json", tmp_path / f"{payload.rstrip('-')}.log"
    proc = spawn_driver(*driver_args(env, topic, payload, job_id), "--opt", "inject.hangAt=before-decision",
                        "--opt", f"inject.markerFile={marker}", log_path=log)
    try:
        wait_marker(marker, proc, log)
    except BaseException:
        kill_group(proc)
        raise
    return proc, log


def write(env, tmp_path, topic: str, payload: str, job_id: str, tag: str) -> None:
    run_driver(*driver_args(env, topic, payload, job_id), log_path=tmp_path / f"{tag}.log")


def test_a_rerun_with_the_same_job_id_and_changed_input_commits_only_its_own_rows(tx_env, tmp_path):
    """The second review's Spark defect: a save() whose driver was killed before its decision, re-run
    with the same jobId on input that changed meanwhile, committed a MIX of both runs: the dead run's
    transaction ids (<job>-p<partition>-t<task attempt>-c<n>) were the new run's too (task attempt ids
    start again at 0), so its sends were taken for duplicates and the decision kept the dead run's
    bodies. Ids are unique per run now: the dead run's members are rolled back."""
    first, log = at_decision(tx_env, tmp_path, "Rerun", "old-", "orders-0042")
    try:
        dead = {t["transaction_id"] for t in tx_env.pending()}
    finally:
        kill_group(first)  # the driver dies before its decision; the job stays OPEN
    write(tx_env, tmp_path, "Rerun", "new-", "orders-0042", "rerun")
    tx_env.wait_settled()
    events = tx_env.events("Rerun")
    assert_published_once_with(events, range(200), "new-")
    assert "an earlier run's job" in (tmp_path / "rerun.log").read_text()
    # the re-run's transactions are its own: none of the dead run's ids, which all rolled back
    assert dead and not dead & {m.transaction_id for m in events}
    assert {tx_env.transaction(t)["state"] for t in dead} == {"ROLLED_BACK"}


def test_two_runs_at_once_with_one_job_id_publish_only_the_later_runs_rows(tx_env, tmp_path):
    """A driver stuck at its decision (paused: a node that stopped answering) while a new run with the
    same jobId goes: the new run aborts the stuck run's job and commits its own; the stuck run,
    resumed, is refused at its decision. Only the new run's rows are published, once."""
    stuck, log = at_decision(tx_env, tmp_path, "Twice", "stuck-", "orders-0043")
    try:
        os.killpg(stuck.pid, signal.SIGSTOP)
        write(tx_env, tmp_path, "Twice", "new-", "orders-0043", "new")
        os.killpg(stuck.pid, signal.SIGCONT)
        (tmp_path / "hook.json.release").write_text("go")
        code = stuck.wait(120)
    finally:
        kill_group(stuck)
    out = log.read_text(errors="replace")
    assert code != 0 and "BATCH DONE" not in out, out[-3000:]
    assert "refused the commit" in out and "ABORTED" in out, out[-3000:]
    tx_env.wait_settled()
    assert_published_once_with(tx_env.events("Twice"), range(200), "new-")


def assert_published_once_with(events, ids, payload: str) -> None:
    bodies = sorted((json.loads(m.body) for m in events), key=lambda b: b["id"])
    assert by_id(events) == Counter(ids), by_id(events) - Counter(ids)
    mixed = [b for b in bodies if b["payload"] != f"{payload}{b['id']}"]
    assert not mixed, f"{len(mixed)} rows of another run: {mixed[:3]}"


def test_a_read_never_holds_part_of_a_job_spanning_groups(spark, cluster_env):
    """The member group follows its home up to a second after the decision (its coordinator told only
    the home): a read planned in between would see the home's half of the job. The reader plans its
    end offsets where every job spanning groups is visible on all of its groups or none."""
    from txbroker.client import AsyncClusterJobCoordinator, Message

    async def commit_at_home_only(n):
        async with AsyncClusterJobCoordinator(GROUP, cluster_env.cluster.bootstrap) as c:
            job = await c.open(timeout=60)
            members = {g: [await c.send(job, g, Message("Whole", json.dumps({"id": n, "g": g}).encode()))]
                       for g in job.all_groups}
            await c.groups.members[job.home].commit(job.job_id, members[job.home],
                                                    {g: ids for g, ids in members.items() if g != job.home})

    def read():
        rows = spark.read.format("txbroker").options(brokers=cluster_env.brokers, topic="Whole").load().collect()
        return Counter(json.loads(r.body)["id"] for r in rows)

    for n in range(4):
        asyncio.run(commit_at_home_only(n))
        seen = read()
        assert all(c == 2 for c in seen.values()), f"job {n}: read {seen}: part of a job"
        assert set(seen) <= set(range(n + 1))
    cluster_env.wait_settled()  # every job resolved on both groups: the read holds all four, whole
    assert read() == Counter({n: 2 for n in range(4)})


def test_a_groups_master_killed_mid_write_leaves_every_row_once(cluster_env, tmp_path):
    marker, log = tmp_path / "slow.json", tmp_path / "driver.log"
    proc = spawn_driver("batch", "--brokers", cluster_env.brokers, "--topic", "Killed", "--group", GROUP,
                        "--rows", "300", "--partitions", "3", "--opt", "inject.slowPartition=0",
                        "--opt", "inject.slowSeconds=8", "--opt", f"inject.markerFile={marker}", log_path=log)
    try:
        wait_marker(marker, proc, log)  # partition 0 sent and is sleeping; others still sending
        g1 = cluster_env.cluster.group("g1")
        g1.master.kill()
        cluster_env.cluster.promote(g1, 1, epoch=2)
        cluster_env.cluster.rejoin(g1, 0)
        assert proc.wait(300) == 0, log.read_text()[-3000:]
    finally:
        kill_group(proc)
    cluster_env.wait_settled()
    assert by_id(cluster_env.events("Killed")) == Counter(range(300))


def test_a_driver_killed_after_its_homes_decision_before_telling_the_other_group_publishes_every_row_once(
        cluster_env, tmp_path):
    """The riskiest moment of a job spanning groups: its home recorded COMMIT, and the driver dies
    before telling the other group. That group asks the home by itself and ends its members as the
    home decided: every row once, on both groups."""
    marker, log = tmp_path / "hook.json", tmp_path / "driver.log"
    proc = spawn_driver("batch", "--brokers", cluster_env.brokers, "--topic", "Untold", "--group", GROUP,
                        "--rows", str(ROWS), "--partitions", "4", "--opt", "jobId=untold",
                        "--opt", "inject.hangAt=after-home-decision", "--opt", f"inject.markerFile={marker}",
                        log_path=log)
    try:
        wait_marker(marker, proc, log)
        (home,) = cluster_env.homes()
        assert (home["name"], home["state"]) == ("untold", "COMMITTED")  # the decision, at the home only
    finally:
        kill_group(proc)  # the driver dies before telling the other group
    cluster_env.wait_settled()
    located = cluster_env.located("Untold")
    assert by_id([m for _g, m in located]) == Counter(range(ROWS))
    assert {g for g, _m in located} == {"g0", "g1"}
    # the home learns that g1 ended its members on its next ask of g1, a tick after they ended there
    (home,) = wait_until(lambda: (h := cluster_env.homes()) and h[0]["resolved"] and h, 30,
                         what="the home to see every group resolve the job")
    assert home["unresolved_groups"] == []
    entry = next(j for j in cluster_env.jobs() if j["home"])
    assert (entry["state"], entry["by"]) == ("COMMITTED", "home")


def test_a_draining_group_gets_no_rows_of_a_new_write(spark, cluster_env):
    """g1 drains (the route says so): a new write's job spans g0 alone and every row lands there;
    g1 holds none of it, and the write is one job all the same."""
    cluster_env.cluster.publish(g1="draining")
    save(rows(spark), cluster_env, "Drained", batchSize=10, jobId="while-g1-drains")
    located = cluster_env.located("Drained")
    assert by_id([m for _g, m in located]) == Counter(range(ROWS))
    assert {g for g, _m in located} == {"g0"}
    (home,) = cluster_env.homes()
    assert (home["name"], home["at"], home["state"], home["groups"]) == ("while-g1-drains", "g0", "COMMITTED", [])


def test_bad_input_is_refused_naming_what_was_wrong(spark, cluster_env):
    from txbroker.client import ClusterJobCoordinator

    with ClusterJobCoordinator("another-pg", cluster_env.cluster.bootstrap) as c:
        c.open(timeout=60, name="taken-by-another-group")
    with pytest.raises(Exception) as e:  # a jobId reused across producer groups
        save(rows(spark, 20), cluster_env, "Bad", jobId="taken-by-another-group")
    assert "producerGroup" in str(e.value) and "another-pg" in str(e.value), str(e.value)[:2000]

    assert cluster_env.events("Bad") == []
    c = cluster_env.cluster  # a route that lists no active group: the brokers refuse it, naming why,
    c.states.update(g0="draining", g1="draining")  # and keep the one in force
    c.version += 1
    c.write()
    master = c.group("g0").master
    wait_until(lambda: "every group is draining" in master.log(), what="the broker to refuse the route")
    assert cluster_env.admin("g0").get("/api/v1/cluster")["route"]["version"] == c.version - 1
    save(rows(spark, 20), cluster_env, "Bad", jobId="on-the-route-in-force")
    assert by_id(cluster_env.events("Bad")) == Counter(range(20))


def test_a_group_that_refuses_a_member_fails_the_write_and_publishes_nothing(spark, cluster_env):
    g1 = cluster_env.cluster.group("g1")
    g1.master.extra_args += ["--max-message-size", "1024"]  # g1 refuses what g0 takes
    g1.master.restart()
    wait_until(lambda: any(x.in_sync for x in cluster_env.admin("g1").broker_info().replication.slaves),
               what="g1's master back, its slave in sync")
    big = spark.range(40, numPartitions=2).selectExpr("id", "repeat('x', 2000) AS payload")
    with pytest.raises(Exception) as e:
        save(big, cluster_env, "Refused", batchSize=5)
    assert "broker group g1 refused" in str(e.value) and "max_message_size" in str(e.value), str(e.value)[:3000]
    cluster_env.wait_settled()
    assert cluster_env.events("Refused") == []  # g0 took its part, and rolled it back with the job
    (home,) = cluster_env.homes()
    assert home["state"] == "ABORTED"
