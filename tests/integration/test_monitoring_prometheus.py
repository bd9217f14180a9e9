"""The chart's monitoring against a real Prometheus (built from its Go module by
testbed/prometheus.sh) on loopback, scraping real broker processes (a master and its slave, with
traffic of every kind the dashboards show) and the operator's metrics endpoint: every query of
every Grafana dashboard (helm/txbroker/files/dashboards/) parses, names only metrics that exist,
and returns data; and the alert rules (alerts.yaml) load and evaluate without error."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest
import yaml

from support.prometheus import Prometheus, built
from support.waiting import wait_until
from tests.conftest import REPO, free_port
from support.dead_letters import dead_letter
from support.listeners import CommitOnCheck, NeverDecides
from txbroker.client import JobCoordinator, Message, Producer, PullConsumer, TransactionProducer
from txbroker.client.admin import AdminClient

FILES = REPO / "helm" / "txbroker" / "files"
DASHBOARDS = sorted((FILES / "dashboards").glob("*.json"))
FAST_CHECKS = ("--check-interval-ms", "300", "--transaction-timeout-ms", "200")
# Grafana's variables, as "All" selects them
VARIABLES = {"$namespace": ".*", "$txbroker": ".*", "$__rate_interval": "15s"}

# The operator's metrics module, serving what a pass, a blocked and a finished failover and a
# drift repair leave behind (the real operator needs a cluster: the e2e run scrapes that one).
OPERATOR = """
import sys, time
from txbroker_operator import metrics
metrics.passed("local", "local", 0.05, True)
metrics.master_state("local", "local", time.time() - 5, "NoInSyncSlave")
metrics.failed_over("local", "local", "FailedOver", time.time() - 12)
metrics.master_state("local", "local", None)
metrics.drift_repaired("Service")
metrics.serve()
sys.stdin.read()
"""


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expression) of every panel target."""
    out = []
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        for panel in doc["panels"]:
            for t in panel.get("targets", []):
                out.append((path.stem, panel["title"], t["expr"]))
    return out


def substitute(expr: str) -> str:
    for k, v in VARIABLES.items():
        expr = expr.replace(k, v)
    return expr


class LocalPrometheus(Prometheus):
    def names(self) -> set[str]:
        return set(self.api("label/__name__/values"))


def selectors(node) -> set[str]:
    """Metric names in a query's syntax tree (Prometheus' /api/v1/parse_query)."""
    out = set()
    if isinstance(node, dict):
        if node.get("type") in ("vectorSelector", "matrixSelector") and node.get("name"):
            out.add(node["name"])
        for v in node.values():
            out |= selectors(v)
    elif isinstance(node, list):
        for v in node:
            out |= selectors(v)
    return out


@pytest.fixture
def operator_metrics():
    port = free_port()
    p = subprocess.Popen([sys.executable, "-c", OPERATOR], stdin=subprocess.PIPE,
                         env={"TXBROKER_OPERATOR_METRICS_PORT": str(port), "PATH": "/usr/bin:/bin"})

    def up():
        assert p.poll() is None, "the operator's metrics process exited"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).close()
            return True
        except OSError:
            return False

    wait_until(up, 20, what="the operator's metrics endpoint")
    yield f"127.0.0.1:{port}"
    p.stdin.close()
    p.kill()
    p.wait(10)


def test_dashboards_and_rules_against_prometheus(broker_factory, operator_metrics, tmp_path):
    master = broker_factory(*FAST_CHECKS, "--broker-name", "local-0", name="m")
    slave = broker_factory("--role", "slave", "--master", master.address, "--broker-name", "local-1", *FAST_CHECKS,
                           name="s")
    # Traffic of every kind the dashboards show.
    AdminClient(master.admin_url).create_topic("Orders", 2)
    with Producer("pg-plain", master.address) as p:
        sent = [p.send(Message("Orders", f"m{i}".encode())) for i in range(8)]
    with TransactionProducer("pg-check", master.address, CommitOnCheck()) as tp:
        tp.send_message_in_transaction([Message("Orders", b"checked")], None)
        wait_until(lambda: AdminClient(master.admin_url).get("/api/v1/broker")["pending_transactions"] == 0, 20,
                   what="the checked-back transaction committed")
    stuck = TransactionProducer("pg-stuck", master.address, NeverDecides()).start()
    stuck.send_message_in_transaction([Message("Orders", b"undecided")], None)
    with JobCoordinator("pg-jobs", master.address) as c:
        job = c.open(timeout=600)
        member = c.send(job.job_id, [Message("Orders", b"job member")])
        c.commit(job.job_id, [member])
    with PullConsumer(master.address) as c:
        c.commit_offsets("cg-metrics", {("Orders", 0): 1, ("Orders", 1): 0})
    dead_letter(master, "cg-metrics", sent[0].msg_id, "Orders")

    port = free_port()
    labels = {"namespace": "local", "txbroker": "local"}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(FILES / "alerts.yaml")],
        "scrape_configs": [
            {"job_name": "txbroker", "static_configs": [
                {"targets": [f"127.0.0.1:{master.admin_port}"], "labels": {**labels, "pod": "local-0"}},
                {"targets": [f"127.0.0.1:{slave.admin_port}"], "labels": {**labels, "pod": "local-1"}}]},
            {"job_name": "txbroker-operator", "honor_labels": True, "static_configs": [
                {"targets": [operator_metrics], "labels": {"namespace": "txbroker-system", "pod": "operator"}}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([str(built("prometheus")), f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        prom = LocalPrometheus(f"http://127.0.0.1:{port}")

        def ready():
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"{prom.url}/-/ready", timeout=1).close()
                return True
            except OSError:
                return False

        wait_until(ready, 60, what="Prometheus ready")
        wait_until(lambda: [t["health"] for t in prom.api("targets")["activeTargets"]] == ["up"] * 3, 60,
                   what="the brokers and the operator scraped")

        queries = dashboard_queries()
        assert len(queries) >= 40 and {d for d, _t, _e in queries} == {
            "txbroker-overview", "txbroker-transactions", "txbroker-consumers", "txbroker-replication"}
        wanted: dict[str, list[str]] = {}
        for dash, title, expr in queries:
            for name in selectors(prom.api("parse_query", query=substitute(expr))):
                wanted.setdefault(name, []).append(f"{dash}: {title}")
        assert len(wanted) >= 30
        wait_until(lambda: set(wanted) <= prom.names(), 60, what="every metric the dashboards name to be scraped")

        # Every query answers with data once rates have two samples.
        def answers(expr: str) -> bool:
            return bool(prom.api("query", query=substitute(expr))["result"])

        for dash, title, expr in queries:
            wait_until(lambda: answers(expr), 30, what=f"data for {dash} / {title}: {expr}")

        # Every rule loads and evaluates cleanly against these series.
        def evaluated() -> list[dict]:
            rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
            assert all(r["health"] != "err" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
            return rules if all(r["health"] == "ok" for r in rules) else []

        rules = wait_until(evaluated, 30, what="every alert rule evaluated")
        alerts = [r for g in yaml.safe_load((FILES / "alerts.yaml").read_text())["groups"] for r in g["rules"]]
        assert sorted(r["name"] for r in rules) == sorted(a["alert"] for a in alerts)
    finally:
        proc.terminate()
        proc.wait(30)
        stuck.shutdown()


def test_dashboards_are_grafana_json():
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        assert doc["uid"] == path.stem and doc["title"].startswith("txbroker / ")
        names = [v["name"] for v in doc["templating"]["list"]]
        assert names[:2] == ["datasource", "namespace"]
        for panel in doc["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
                for t in panel["targets"]:
                    assert not re.search(r"\$(?!namespace|txbroker|__rate_interval|datasource)\w+", t["expr"]), t["expr"]
