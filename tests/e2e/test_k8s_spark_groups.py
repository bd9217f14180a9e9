"""The chart's Spark job across the broker groups of one TxBroker, on the real node (issue 31, item
7): a TxBroker of two groups (two brokers each, SYNC), and the orders job (keyColumn order_id,
commit=deferred) in both of the chart's forms, bootstrapping from the TxBroker's `<name>-master`
Service (every group's master; the data source learns the route from whichever answers).

- spark-submit Job: the driver dies right after the job's COMMIT decision, before it ends or waits
  for anything: it exits (the orders job's `--inject-crash after-decision`, passed through
  `spark.job.extraArgs`), or it waits (`--inject-hang after-decision`) and its pod is force-deleted;
  the brokers publish every row anyway, once; the Job ends Failed (with the driver's exit code, 17,
  when there is one), not Complete.
- SparkApplication through the kubeflow Spark operator: the master of the job's home group (the
  group that decides it) is force-deleted while the executors write half messages to both groups;
  the operator fails that group over; the job commits with every row once, or fails and publishes
  nothing, never part.

Either way each order lands once, on the (group, queue) its key maps to: crc32 of the key over
every queue of the topic on the active groups, in route order (spark/txbroker_spark/cluster.py
RowPlacement, the cluster clients' key_selector), read back by consumer pods from each group's
master. How the operator and the Spark operator run: operator_env.py, spark_operator.py.
"""

from __future__ import annotations

import json
import zlib

import pytest
from support.waiting import wait_until
from operator_env import CHART, admin, condition, events_for, read_topic, service_endpoints, start_operator, txbroker

import spark_operator

pytestmark = pytest.mark.e2e

TOPIC, PRODUCER_GROUP = "OrderEvents", "orders-publisher"
GROUPS = ("g0", "g1")


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-sparkgrp-{worker_id}")


# -- the TxBroker --------------------------------------------------------------------------------

def pods_of(name: str) -> dict[str, list[str]]:
    """A TxBroker of two groups, two brokers each: group -> its pods (the first is its first master)."""
    return {"g0": [f"{name}-0", f"{name}-1"], "g1": [f"{name}-g1-0", f"{name}-g1-1"]}


def two_groups(operator, name: str) -> None:
    """A TxBroker `name` of two groups (SYNC, as a user keeping every acknowledged write through a
    failover runs it), Running with a master per group, its `<name>-master` Service on both masters."""
    tb, ns = operator.testbed, operator.namespace
    tb.apply(txbroker(name, replicas=2, groups=2, replication="SYNC", flush="SYNC",
                      failover={"gracePeriodSeconds": 3}), ns)

    def running():
        assert not (down := operator.exited()), down
        t = tb.get("txb", name, ns)
        st = t.get("status") or {}
        return st.get("phase") == "Running" and st.get("masters") == f"g0={name}-0,g1={name}-g1-0"
    try:
        wait_until(running, 300, f"TxBroker {name} Running with two groups")
    except TimeoutError:
        raise AssertionError(f"{name} not Running:\n" + tb.kubectl("-n", ns, "get", "pods,txb", "-o", "wide").stdout
                             + json.dumps((tb.get("txb", name, ns) or {}).get("status"), indent=1)[-3000:]
                             + "\noperator log:\n" + operator.log.read_text()[-4000:]) from None
    masters = sorted(f"{tb.get('pod', p, ns)['status']['podIP']}:10911" for p in (f"{name}-0", f"{name}-g1-0"))
    wait_until(lambda: service_endpoints(tb, ns, f"{name}-master") == masters, 60, f"{name}-master: both masters")


def group_block(txb: dict, group: str) -> dict:
    return next((g for g in (txb.get("status") or {}).get("groups") or [] if g["name"] == group), {})


def master_pod(tb, ns: str, name: str, group: str) -> dict:
    """The pod the TxBroker's status names `group`'s master."""
    return tb.get("pod", group_block(tb.get("txb", name, ns), group)["master"], ns)


def masters(tb, ns: str, name: str) -> dict[str, dict]:
    return {g: master_pod(tb, ns, name, g) for g in GROUPS}


def assert_bootstraps_from_the_master_service(tb, ns: str, name: str, args: list[str]) -> None:
    """The chart's Spark job starts from `<name>-master` (what "txbroker.spark.brokers" renders
    without spark.broker.address), a Service on every group's master, never one group's pod."""
    assert args[args.index("--brokers") + 1] == f"{name}-master.{ns}.svc:10911", args
    selector = tb.get("service", f"{name}-master", ns)["spec"]["selector"]
    assert selector.get("txbroker.dev/role") == "master" and "txbroker.dev/group" not in selector, selector
    ips = sorted(f"{p['status']['podIP']}:10911" for p in masters(tb, ns, name).values())
    assert service_endpoints(tb, ns, f"{name}-master") == ips


# -- the chart's Spark job -------------------------------------------------------------------------

def small_pods() -> list[str]:
    """helm arguments: the job's pods request little (as in test_k8s_spark_on_node.py): four brokers,
    the operators and the Spark job share the node's two cores."""
    small = {"spark.kubernetes.driver.request.cores": "100m", "spark.kubernetes.executor.request.cores": "100m",
             "spark.executor.memoryOverhead": "256m", "spark.driver.memoryOverhead": "256m"}
    escaped = {k.replace(".", "\\."): v for k, v in small.items()}   # helm --set reads dots as nesting
    return [a for k, v in escaped.items() for a in ("--set-string", f"spark.job.sparkConf.{k}={v}")]


def install_job(tb, ns: str, release: str, broker: str, mode: str, orders: int, extra_args: list[str],
                *more: str) -> None:
    """The chart's Spark job (the orders job) as release `release`, publishing to TxBroker `broker`;
    no broker address given: the chart's default bootstrap."""
    tb.helm("install", release, CHART, "-n", ns, "--set", "operator.replicas=0",
            "--set", f"operator.watchNamespaces={{{ns}}}", "--set", "spark.enabled=true",
            "--set", f"spark.mode={mode}", "--set", f"spark.broker.name={broker}",
            "--set", f"spark.job.orders={orders}", "--set", "spark.job.partitions=4", "--set", "spark.job.batchSize=200",
            "--set", "spark.driver.memory=768m", "--set", "spark.executor.memory=768m",
            "--set", "spark.executor.instances=2", "--set", "spark.data.size=1Gi",
            "--set", f"spark.job.extraArgs={{{','.join(extra_args)}}}", *more, *small_pods(), timeout=180)


def spark_pods(tb, ns: str, release: str, role: str) -> list[dict]:
    return tb.list("pods", ns, f"spark-role={role},app.kubernetes.io/instance={release}")


def running(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def summary_of(log: str) -> dict | None:
    line = next((x for x in log.splitlines() if x.startswith("SUMMARY ")), None)
    return dict(kv.split("=", 1) for kv in line.split()[1:]) if line else None


# -- what the brokers hold -------------------------------------------------------------------------

def jobs_on(tb, ns: str, name: str, at: dict[str, dict] | None = None) -> dict[str, list[dict]]:
    """group -> the producer group's jobs its master (as the status names it now, or `at`) lists (at
    the home: the job; elsewhere: its entry, which names the home)."""
    return {g: admin(p).get(f"/api/v1/jobs?group={PRODUCER_GROUP}")["jobs"]
            for g, p in (at or masters(tb, ns, name)).items()}


def home_of(jobs: dict[str, list[dict]]) -> tuple[str, dict] | None:
    """(the home group, the job there) of the one job of the producer group, once its home lists it."""
    homes = [(g, j) for g, js in jobs.items() for j in js if not j.get("home")]
    assert len(homes) <= 1, f"more than one job of {PRODUCER_GROUP}: {jobs}"
    return homes[0] if homes else None


def layout(tb, ns: str, name: str) -> list[tuple[str, int]]:
    """(group, the topic's queue count there) for the active groups, in route order: the route the
    brokers serve (what the driver learned through `<name>-master`)."""
    ms = masters(tb, ns, name)
    route = admin(ms["g0"]).get("/api/v1/cluster")["route"]
    active = [g["name"] for g in route["groups"] if g["state"] == "active"]
    assert active == list(GROUPS), route
    return [(g, len(admin(ms[g]).get(f"/api/v1/topics/{TOPIC}")["queues"])) for g in active]


def place(key: str, groups: list[tuple[str, int]]) -> tuple[str, int]:
    """Where a key's rows go: crc32 of the key over every queue of the topic on the groups, in order."""
    index = zlib.crc32(key.encode()) % sum(n for _g, n in groups)
    for group, n in groups:
        if index < n:
            return group, index
        index -= n
    raise AssertionError("unreachable")


def read_groups(tb, ns: str, name: str, tag: str) -> dict[str, list[tuple[int, dict]]]:
    """Every committed OrderEvents message on each group, read by a consumer pod (`txbroker tail`) from
    the group's master: group -> [(queue, body)]."""
    out = {}
    for g, pod in masters(tb, ns, name).items():
        lines = read_topic(tb, ns, f"{pod['status']['podIP']}:10911", TOPIC, f"{tag}-read-{g}", 300)
        rows = []
        for line in lines:   # HH:MM:SS OrderEvents:Q@OFFSET MSGID tags=... tx=... {body}
            where = line.split()[1]
            assert where.startswith(f"{TOPIC}:"), line
            rows.append((int(where.split(":", 1)[1].split("@")[0]), json.loads(line[line.index("{"):])))
        out[g] = rows
    return out


def assert_every_order_once_on_its_group(seen: dict[str, list[tuple[int, dict]]], groups: list[tuple[str, int]],
                                         orders: int, job: str) -> None:
    placed: dict[str, list[tuple[str, int]]] = {}
    for g, rows in seen.items():
        for queue, body in rows:
            placed.setdefault(body["order_id"], []).append((g, queue))
    twice = {k: v for k, v in placed.items() if len(v) > 1}
    assert not twice, f"{len(twice)} orders published more than once, e.g. {list(twice.items())[:3]}"
    missing = sorted({f"o-{i:08d}" for i in range(orders)} - set(placed))
    assert not missing and len(placed) == orders, f"{len(missing)} orders missing, e.g. {missing[:5]}; {len(placed)} seen"
    misplaced = {k: (v[0], place(k, groups)) for k, v in placed.items() if v[0] != place(k, groups)}
    assert not misplaced, f"{len(misplaced)} orders off their key's (group, queue), e.g. {list(misplaced.items())[:3]}"
    per_group = {g: len(rows) for g, rows in seen.items()}
    assert all(per_group.values()), f"a group got no orders: {per_group}"
    assert {body["job"] for rows in seen.values() for _q, body in rows} == {job}


def assert_settled(tb, ns: str, name: str) -> None:
    """No half transaction left on any group, and the producer group job-only (the chart's
    TxProducerGroup, checkMode ledger) on every group's master."""
    for g, pod in masters(tb, ns, name).items():
        a = admin(pod)
        wait_until(lambda a=a: a.get("/api/v1/transactions")["total"] == 0, 120, f"{g}: no transaction pending")
        assert a.get("/api/v1/groups")[PRODUCER_GROUP]["require_job"] is True, g


def spark_report(tb, ns: str, release: str) -> str:
    return (tb.kubectl("-n", ns, "get", "pods,txb,sparkapp", "-o", "wide", check=False).stdout
            + "".join(f"\n--- {p['metadata']['name']}:\n" + tb.pod_log(p["metadata"]["name"], ns)[-4000:]
                      for p in spark_pods(tb, ns, release, "driver")))


# -- 1. spark-submit: the driver dies right after the decision ------------------------------------

@pytest.fixture
def submit_release(operator, ending):
    """The chart's spark-submit form as its own release per case (its RBAC is partly cluster-wide:
    two cases at once under one name collide; uninstalled after, as part of it outlives the
    namespace); its driver pod, which spark-submit leaves, deleted with it."""
    release = "grporders" if ending == "driver exits" else "grpdelete"
    yield release
    operator.testbed.helm("uninstall", release, "-n", operator.namespace, check=False)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("ending", ["driver exits", "driver pod deleted"])
def test_spark_submit_across_two_groups_publishes_every_order_once_though_the_driver_dies_after_its_decision(
        operator, submit_release, ending):
    tb, ns, orders = operator.testbed, operator.namespace, 30_000
    name = "subgrp" if ending == "driver exits" else "subdel"
    two_groups(operator, name)
    crash = ["--inject-crash", "after-decision"] if ending == "driver exits" else ["--inject-hang", "after-decision"]
    install_job(tb, ns, submit_release, name, "sparkSubmit", orders, ["--progress-seconds", "1", *crash])
    submit = f"{submit_release}-spark-1-submit"
    container = tb.get("job", submit, ns)["spec"]["template"]["spec"]["containers"][0]
    assert_bootstraps_from_the_master_service(tb, ns, name, container["args"])

    def driver_pod():
        return (spark_pods(tb, ns, submit_release, "driver") or [None])[0]
    if ending == "driver exits":
        def driver_ended():
            pod = driver_pod()
            return pod and pod["status"].get("phase") in ("Succeeded", "Failed") and pod
        try:
            driver = wait_until(driver_ended, 900, "the driver pod to end")
        except TimeoutError:
            raise AssertionError(spark_report(tb, ns, submit_release)) from None
        log = tb.pod_log(driver["metadata"]["name"], ns)
        said_now = "inject-crash=after-decision: the driver exits now"
    else:   # the driver waits after its decision until its pod is force-deleted, as a node lost would
        def waiting_after_decision():
            pod = driver_pod()
            return pod and "inject-hang=after-decision" in tb.pod_log(pod["metadata"]["name"], ns) and pod
        try:
            driver = wait_until(waiting_after_decision, 900, "the driver to record its decision", interval=1)
        except TimeoutError:
            raise AssertionError(spark_report(tb, ns, submit_release)) from None
        log = tb.pod_log(driver["metadata"]["name"], ns)
        tb.kubectl("-n", ns, "delete", "pod", driver["metadata"]["name"], "--grace-period=0", "--force")
        wait_until(lambda: tb.get("pod", driver["metadata"]["name"], ns) is None, 60, "the driver pod gone")
        said_now = "inject-hang=after-decision: the driver waits here to be killed"
    # it died right after its decision: the commit point was reached, nothing after it ran
    assert said_now in log, log[-6000:]
    assert "3/4 commit point" in log and ": 4/4 dataset moved" not in log and summary_of(log) is None, log[-6000:]

    # the home recorded COMMIT (by the driver) and every group ended its members from it, on its own
    try:
        home, job = wait_until(lambda: (h := home_of(jobs_on(tb, ns, name))) and h[1]["resolved"] and h, 180,
                               "the job decided and resolved on every group")
    except TimeoutError:
        raise AssertionError(json.dumps(jobs_on(tb, ns, name), indent=1)) from None
    assert (job["state"], job["by"], job["pending"], job["unresolved_groups"]) == ("COMMITTED", "client", 0, []), job
    others = [g for g in GROUPS if g != home]
    assert job["groups"] == others, job                                    # the job spans both groups
    for g in others:
        (entry,) = jobs_on(tb, ns, name)[g]
        assert (entry["job_id"], entry["home"], entry["state"], entry["pending"]) == (job["job_id"], home, "COMMITTED", 0)

    groups = layout(tb, ns, name)
    seen = read_groups(tb, ns, name, name)  # its consumer pods named after the case: both may run in one namespace
    assert_every_order_once_on_its_group(seen, groups, orders, job["name"])
    assert_settled(tb, ns, name)
    # the spark-submit Job ends as its driver did: Failed, never Complete, although spark-submit itself
    # exits 0 (the chart's files/spark-submit.py reads the driver pod)
    done = wait_until(lambda: (j := tb.get("job", submit, ns)) and [
        c["type"] for c in (j.get("status") or {}).get("conditions") or []
        if c["type"] in ("Complete", "Failed") and c["status"] == "True"], 300, "the spark-submit Job to finish")
    (submitter,) = tb.list("pods", ns, f"job-name={submit}")
    said = tb.pod_log(submitter["metadata"]["name"], ns)
    assert done == ["Failed"], f"the Job says {done} for a driver that died; its log:\n{said[-4000:]}"
    assert driver["metadata"]["name"] == f"{submitter['metadata']['name']}-driver"   # named after the Job's pod
    (submit_end,) = [c["state"]["terminated"] for c in tb.get("pod", submitter["metadata"]["name"], ns)["status"]
                     ["containerStatuses"]]
    if ending == "driver exits":   # the crash's exit code 17, passed on
        (ended,) = [c["state"]["terminated"] for c in driver["status"]["containerStatuses"]
                    if c["name"] == "spark-kubernetes-driver"]
        assert ended["exitCode"] == 17, ended
        line = (f"the Spark driver (pod {driver['metadata']['name']}, container spark-kubernetes-driver) "
                "exited with code 17")
        assert line in said, said[-4000:]
        assert submit_end["exitCode"] == 17, submit_end
    else:   # no exit code to read: the pod is gone, and the Job fails for it
        assert f"the Spark driver pod {driver['metadata']['name']} is gone" in said, said[-4000:]
        assert submit_end["exitCode"] != 0, submit_end
    print(f"spark-submit Job ({ending}): {done}; submitter: {said.strip().splitlines()[-1]}; "
          f"rows per group: { {g: len(r) for g, r in seen.items()} }; home {home}; layout {groups}")
    tb.kubectl("-n", ns, "delete", "txb", name, "--wait=false")


# -- 2. SparkApplication: the home group's master force-deleted mid-write ----------------------------

def spark_operator_release(ns: str) -> str:
    return f"spark-operator-{ns}"[:53]


@pytest.fixture
def app_release(operator):
    """The chart's SparkApplication form as release `grpapp`, beside the Spark operator's release;
    both uninstalled after."""
    yield "grpapp"
    for release in ("grpapp", spark_operator_release(operator.namespace)):
        operator.testbed.helm("uninstall", release, "-n", operator.namespace, check=False)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_spark_application_across_two_groups_is_all_or_nothing_when_a_group_fails_over_mid_write(
        operator, app_release):
    tb, ns, name, orders = operator.testbed, operator.namespace, "appgrp", 40_000
    spark_operator.apply_crds(tb)
    controller, controller_sa = spark_operator.install(tb, ns, spark_operator_release(ns))
    two_groups(operator, name)
    install_job(tb, ns, app_release, name, "sparkApplication", orders, ["--progress-seconds", "1"],
                # the Spark operator runs spark-submit, which (Spark 4.3) applies the driver's NetworkPolicy
                "--set", f"spark.sparkOperatorServiceAccount={ns}/{controller_sa}")
    app = f"{app_release}-spark-1"
    assert_bootstraps_from_the_master_service(tb, ns, name, tb.get("sparkapplication", app, ns)["spec"]["arguments"])

    # the executors write: the job is OPEN at its home, with half messages stored on both groups
    first = masters(tb, ns, name)

    def writing():
        jobs = jobs_on(tb, ns, name, first)
        if not any(j["pending"] for js in jobs.values() for j in js):
            return None
        if len(running(spark_pods(tb, ns, app_release, "executor"))) < 2:
            return None
        found = home_of(jobs)
        if not found or found[1]["state"] != "OPEN":
            return None
        both = all(any(j["job_id"] == found[1]["job_id"] and j["state"] == "OPEN" and j["pending"] for j in jobs[g])
                   for g in GROUPS)
        return both and found
    try:
        home, job = wait_until(writing, 600, "two executors writing half messages to both groups", interval=0.3)
    except TimeoutError:
        raise AssertionError(spark_report(tb, ns, app_release)
                             + tb.kubectl("-n", ns, "logs", f"deployment/{controller}", check=False).stdout[-3000:]) from None
    # the master of the group that decides the job goes, mid-write
    lost = group_block(tb.get("txb", name, ns), home)["master"]
    heir = next(p for p in pods_of(name)[home] if p != lost)
    other = next(g for g in GROUPS if g != home)
    other_before = group_block(tb.get("txb", name, ns), other)
    tb.kubectl("-n", ns, "delete", "pod", lost, "--grace-period=0", "--force", check=False)
    # (for the report: whether the driver had logged the end of its write when the master went)
    drivers = spark_pods(tb, ns, app_release, "driver")
    sent_before = bool(drivers) and "events stored invisibly" in tb.pod_log(drivers[0]["metadata"]["name"], ns)

    # the operator fails that group over, and only it
    def failed_over():
        t = tb.get("txb", name, ns)
        b, o = group_block(t, home), group_block(t, other)
        assert (o.get("master"), o.get("epoch")) == (other_before["master"], other_before["epoch"]), \
            f"{other} touched by {home}'s failover: {o}"
        cond = condition(t, "FailedOver")
        return (b.get("master") == heir and b.get("epoch", 1) >= 2 and cond and cond["status"] == "True"
                and (t["status"].get("lastFailover") or {}).get("group") == home and t)
    try:
        txb = wait_until(failed_over, 120, f"{home} failed over to {heir}", interval=0.5)
    except TimeoutError:
        raise AssertionError(f"no failover of {home}; operator log:\n" + operator.log.read_text()[-5000:]) from None
    assert txb["status"]["lastFailover"]["from"] == lost
    said = [e for e in events_for(tb, ns, name) if e["reason"] == "FailedOver"]
    assert said and all(e["message"].startswith(f"group {home}: ") for e in said), said

    def finished():
        state = (((tb.get("sparkapplication", app, ns) or {}).get("status") or {}).get("applicationState") or {})
        return state.get("state") in ("COMPLETED", "FAILED", "SUBMISSION_FAILED") and state
    try:
        state = wait_until(finished, 900, f"SparkApplication {app} to finish")
    except TimeoutError:
        raise AssertionError(spark_report(tb, ns, app_release)) from None
    sa = tb.get("sparkapplication", app, ns)
    log = tb.pod_log(sa["status"]["driverInfo"]["podName"], ns)
    summary = summary_of(log)

    # the job's decision, as its home records it (on the heir now), reached every group
    try:
        home_now, decided = wait_until(
            lambda: (h := home_of(jobs_on(tb, ns, name))) and h[1]["state"] in ("COMMITTED", "ABORTED")
            and h[1]["resolved"] and h, 300, "the job decided and resolved on every group")
    except TimeoutError:
        raise AssertionError(json.dumps(jobs_on(tb, ns, name), indent=1) + "\ndriver log:\n" + log[-6000:]) from None
    assert (home_now, decided["job_id"]) == (home, job["job_id"]), (home_now, decided)
    seen = read_groups(tb, ns, name, "app")
    rows = sum(len(r) for r in seen.values())
    print(f"SparkApplication {state['state']}; job {decided['state']} by {decided['by']}; home {home} "
          f"(master {lost} -> {heir}, write over before that: {sent_before}); rows per group: { {g: len(r) for g, r in seen.items()} }; summary {summary}")
    if decided["state"] == "COMMITTED":   # every row once, each on its key's group
        assert decided["by"] == "client", decided
        assert_every_order_once_on_its_group(seen, layout(tb, ns, name), orders, decided["name"])
        assert state["state"] == "COMPLETED", f"committed, yet the SparkApplication {state}; driver log:\n{log[-4000:]}"
        assert summary and summary["decision"] == "COMMITTED" and summary["rows"] == str(orders), (summary, log[-4000:])
    else:   # the write failed: nothing of it published, on any group
        assert rows == 0, f"an aborted job published {rows} rows: { {g: len(r) for g, r in seen.items()} }"
        assert state["state"] == "FAILED", f"aborted, yet the SparkApplication {state}; driver log:\n{log[-4000:]}"
        assert summary and summary["decision"] == "ABORTED", (summary, log[-4000:])
    assert_settled(tb, ns, name)
    tb.kubectl("-n", ns, "delete", "txb", name, "--wait=false")
