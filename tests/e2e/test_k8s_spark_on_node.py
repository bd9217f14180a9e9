"""Spark on Kubernetes, for real: the chart's spark-submit Job runs `spark-submit --master
k8s://https://kubernetes.default.svc --deploy-mode cluster` with the job image built from
spark/Dockerfile; the driver pod starts executor pods; one executor pod is deleted while the job
writes; the job commits, and a consumer pod sees every order exactly once, none from the lost
executor's attempt. The chart's other form, a SparkApplication, runs through the kubeflow Spark
operator built from its Go module and installed from its own chart (spark_operator.py).
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from support.waiting import wait_until
from operator_env import CHART, admin, read_topic, start_operator, txbroker, wait_broker

import spark_operator

pytestmark = pytest.mark.e2e

ORDERS = 60_000


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-spark-{worker_id}", resync_seconds=2)


def spark_pods(tb, ns: str, role: str) -> list[dict]:
    return tb.list("pods", ns, f"spark-role={role}")


def running(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def small_pods() -> list[str]:
    """helm arguments: the job's pods request little, so that two Spark jobs fit on the node at once."""
    small = {"spark.kubernetes.driver.request.cores": "100m", "spark.kubernetes.executor.request.cores": "100m",
             "spark.executor.memoryOverhead": "256m", "spark.driver.memoryOverhead": "256m"}
    escaped = {k.replace(".", "\\."): v for k, v in small.items()}   # helm --set reads dots as nesting
    return [a for k, v in escaped.items() for a in ("--set-string", f"spark.job.sparkConf.{k}={v}")]


@pytest.fixture
def release(operator):
    """The chart's Spark job installed as release `orders` (uninstalled after: its RBAC is cluster-wide
    in part, and outlives the namespace)."""
    yield "orders"
    operator.testbed.helm("uninstall", "orders", "-n", operator.namespace, check=False)


@pytest.mark.timeout(900)
def test_spark_submit_on_the_node_commits_every_order_once_despite_a_lost_executor(operator, release):
    tb, ns = operator.testbed, operator.namespace
    tb.apply(txbroker("orders", replicas=1), ns)
    wait_broker(operator, ns, "orders")
    tb.helm("install", release, CHART, "-n", ns, "--set", "operator.replicas=0",
            "--set", f"operator.watchNamespaces={{{ns}}}", "--set", "spark.enabled=true",
            "--set", "spark.mode=sparkSubmit", "--set", "spark.broker.name=orders",
            "--set", f"spark.job.orders={ORDERS}", "--set", "spark.job.partitions=4", "--set", "spark.job.batchSize=200",
            "--set", "spark.driver.memory=768m", "--set", "spark.executor.memory=768m",
            "--set", "spark.executor.instances=2", "--set", "spark.data.size=1Gi",
            "--set", "spark.job.extraArgs={--progress-seconds,1}", *small_pods(), timeout=180)
    job = "orders-spark-1-submit"
    # the driver starts at least two executors
    try:
        executors = wait_until(lambda: len(running(spark_pods(tb, ns, "executor"))) >= 2 and
                             running(spark_pods(tb, ns, "executor")), 300, "two executor pods running")
    except TimeoutError:
        raise AssertionError(tb.kubectl("-n", ns, "get", "pods,pvc", "-o", "wide").stdout + "\n".join(
            tb.pod_log(p["metadata"]["name"], ns)[-3000:] for p in tb.list("pods", ns, "spark-role=driver"))
            + tb.pod_log(tb.list("pods", ns, f"job-name={job}")[0]["metadata"]["name"], ns)[-3000:]) from None
    driver = spark_pods(tb, ns, "driver")[0]["metadata"]["name"]

    # delete one executor while the job writes (its transactions are open on the broker)
    # tasks are sending: the driver's progress line says so, or the broker holds the job still OPEN
    # (the write's commit prepares it) with half messages in it
    sending = re.compile(r"1/4 sending: stage \d+: \d+/\d+ tasks done, [1-9]\d* running")
    broker = admin(tb.get("pod", "orders-0", ns))

    def writing() -> bool:
        jobs = broker.get("/api/v1/jobs?state=open")["jobs"]
        return bool(sending.search(tb.pod_log(driver, ns)) or any(j["pending"] for j in jobs))

    try:
        wait_until(writing, 300, "tasks sending half messages")
    except TimeoutError:
        raise AssertionError("no progress line with tasks sending; the driver's log:\n"
                             + tb.pod_log(driver, ns)[-6000:]) from None
    lost, lost_id = executors[0]["metadata"]["name"], executors[0]["metadata"]["labels"]["spark-exec-id"]
    tb.kubectl("-n", ns, "delete", "pod", lost, "--wait=false")

    # Complete or Failed: since Kubernetes 1.31 the Job controller first says SuccessCriteriaMet (or
    # FailureTarget), and the terminal condition follows once the Job's pods have terminated
    done = wait_until(lambda: (j := tb.get("job", job, ns)) and any(
        c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in (j.get("status") or {}).get("conditions") or [])
        and j, 600, "the spark-submit Job to finish")
    log = tb.pod_log(driver, ns)
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in done["status"]["conditions"]), log[-4000:]
    # Complete because the driver exited 0 (the chart's wrapper read it; a failed driver fails the Job)
    submitter = tb.list("pods", ns, f"job-name={job}")[0]["metadata"]["name"]
    assert (f"the Spark driver (pod {driver}, container spark-kubernetes-driver) exited with code 0 (Completed): "
            "the Job succeeds") in tb.pod_log(submitter, ns), tb.pod_log(submitter, ns)[-3000:]
    summary = dict(kv.split("=", 1) for kv in next(line for line in log.splitlines()
                                                   if line.startswith("SUMMARY ")).split()[1:])
    assert summary["decision"] == "COMMITTED" and summary["rows"] == str(ORDERS), summary
    # Spark saw the executor go and ran its work again elsewhere (a task it was running, or the
    # output it had written); its attempts' half transactions are not in the job's decision, and
    # the broker rolls them back when it records it
    assert f"Lost executor {lost_id}" in log, log[-4000:]

    assert_every_order_once(tb, ns, "orders", ORDERS)
    # the decision was the broker's: one committed job, in a group that (checkMode ledger) takes no
    # transaction outside a job; nothing left pending, no checker anywhere
    (job,) = broker.get("/api/v1/jobs")["jobs"]
    assert (job["state"], job["by"], job["resolved"]) == ("COMMITTED", "client", True), job
    assert broker.get("/api/v1/groups")[job["producer_group"]]["require_job"] is True
    assert broker.get("/api/v1/transactions")["total"] == 0


def assert_every_order_once(tb, ns: str, broker: str, orders: int) -> None:
    """A consumer pod reads OrderEvents through the master's Service: every order exactly once, and
    one run's rows only (none of an aborted attempt's)."""
    lines = read_topic(tb, ns, f"{broker}-master.{ns}.svc.cluster.local:10911", "OrderEvents", f"{broker}-consumer", 300)
    bodies = [json.loads(line[line.index("{"):]) for line in lines if "{" in line]
    ids = Counter(b["order_id"] for b in bodies)
    assert len(ids) == orders and not [i for i, n in ids.items() if n > 1], (len(ids), ids.most_common(3))
    assert len({b["job"] for b in bodies}) == 1


@pytest.fixture
def app_release(operator):
    """The chart's SparkApplication form as release `apporders`, on a TxBroker of its own (the other
    test's volumes and topic may still be in this namespace), beside the Spark operator's release;
    both uninstalled after."""
    yield "apporders"
    for release in ("apporders", spark_operator_release(operator.namespace)):
        operator.testbed.helm("uninstall", release, "-n", operator.namespace, check=False)


def spark_operator_release(ns: str) -> str:
    return f"spark-operator-{ns}"[:53]


@pytest.mark.timeout(900)
def test_spark_application_through_the_spark_operator_commits_every_order_once(operator, app_release):
    """The chart's SparkApplication form, run by the kubeflow Spark operator (built from its Go
    module, installed from its own chart): the operator submits the job, the driver starts the
    executors, the job commits, and a consumer pod reads every order once."""
    tb, ns = operator.testbed, operator.namespace
    spark_operator.apply_crds(tb)
    controller, controller_sa = spark_operator.install(tb, ns, spark_operator_release(ns))
    tb.apply(txbroker(app_release, replicas=1), ns)
    wait_broker(operator, ns, app_release)
    orders = 20_000
    tb.helm("install", app_release, CHART, "-n", ns, "--set", "operator.replicas=0",
            "--set", f"operator.watchNamespaces={{{ns}}}", "--set", "spark.enabled=true",
            "--set", "spark.mode=sparkApplication", "--set", f"spark.broker.name={app_release}",
            # the Spark operator runs spark-submit, which (Spark 4.3) applies the driver's NetworkPolicy
            "--set", f"spark.sparkOperatorServiceAccount={ns}/{controller_sa}",
            "--set", f"spark.job.orders={orders}", "--set", "spark.job.partitions=4", "--set", "spark.job.batchSize=200",
            "--set", "spark.driver.memory=768m", "--set", "spark.executor.memory=768m",
            "--set", "spark.executor.instances=2", "--set", "spark.data.size=1Gi", *small_pods(), timeout=180)
    app = f"{app_release}-spark-1"

    def finished():
        state = (((tb.get("sparkapplication", app, ns) or {}).get("status") or {}).get("applicationState") or {})
        return state.get("state") in ("COMPLETED", "FAILED", "SUBMISSION_FAILED", "INVALIDATING") and state
    try:
        state = wait_until(finished, 600, f"SparkApplication {app} to finish")
    except TimeoutError:
        raise AssertionError(tb.kubectl("-n", ns, "get", "sparkapp,pods", "-o", "wide").stdout
                             + tb.kubectl("-n", ns, "logs", f"deployment/{controller}", check=False).stdout[-4000:]) from None
    sa = tb.get("sparkapplication", app, ns)
    driver = (sa["status"].get("driverInfo") or {}).get("podName")
    log = tb.pod_log(driver, ns) if driver else ""
    assert state["state"] == "COMPLETED", f"{state.get('errorMessage', '')[:3000]}\ndriver log:\n{log[-4000:]}"
    # the operator tracked the executors the driver started
    assert len(sa["status"].get("executorState") or {}) >= 2, sa["status"]
    summary = dict(kv.split("=", 1) for kv in next(line for line in log.splitlines()
                                                   if line.startswith("SUMMARY ")).split()[1:])
    assert summary["decision"] == "COMMITTED" and summary["rows"] == str(orders), summary
    # what `kubectl get sparkapp` shows a user
    table = tb.kubectl("-n", ns, "get", "sparkapplication", app).stdout
    assert "COMPLETED" in table, table
    assert_every_order_once(tb, ns, app_release, orders)
