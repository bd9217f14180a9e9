"""Monitoring on the real node (issue 21): a real Prometheus (built from its Go module by
testbed/prometheus.sh), running in the cluster's network as the tests do, discovers the broker pods
and the operator's pod through the API server as the chart's PodMonitor and ServiceMonitor select
them, scrapes them, and evaluates the chart's alert rules (helm/txbroker/files/alerts.yaml). The
master's pod is killed: the operator fails over, TxBrokerFailedOver fires, then resolves.

The one change to the rules: TxBrokerFailedOver's 10-minute window is 90 s here, so that the test
sees it resolve without waiting 10 minutes (promtool's unit tests cover the real window)."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from support.prometheus import Prometheus, built
from support.waiting import wait_until
from operator_env import OPERATOR_NAMESPACE, start_operator, txbroker, wait_broker

from cluster import ROOT

pytestmark = pytest.mark.e2e

RULES = ROOT / "helm" / "txbroker" / "files" / "alerts.yaml"
FAILOVER_WINDOW_S = 90


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-mon-{worker_id}")


def scrape_configs(kubeconfig: Path, namespace: str, release: str) -> list[dict]:
    """What the Prometheus Operator makes of the chart's PodMonitor (broker pods: the operator's
    managed-by label, port admin, txbroker from the pod's txbroker.dev/broker label) and
    ServiceMonitor (the operator's pod, port 8081, honorLabels)."""
    def sd(ns: str) -> list[dict]:
        return [{"role": "pod", "kubeconfig_file": str(kubeconfig), "namespaces": {"names": [ns]}}]

    common = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    return [
        {"job_name": "txbroker-brokers", "kubernetes_sd_configs": sd(namespace), "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_managed_by"],
             "regex": "txbroker-operator", "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "admin", "action": "keep"},
            *common,
            {"source_labels": ["__meta_kubernetes_pod_label_txbroker_dev_broker"], "target_label": "txbroker"},
        ]},
        {"job_name": "txbroker-operator", "honor_labels": True, "kubernetes_sd_configs": sd(OPERATOR_NAMESPACE),
         "relabel_configs": [
             {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"], "regex": release,
              "action": "keep"},
             {"source_labels": ["__meta_kubernetes_pod_ip"], "target_label": "__address__",
              "replacement": "${1}:8081"},
             *common,
         ]},
    ]


@pytest.fixture
def prometheus(operator, tmp_path):
    rules = RULES.read_text()
    marker = "(txbroker_operator_last_failover_timestamp_seconds) < 600"
    assert marker in rules
    (tmp_path / "alerts.yaml").write_text(rules.replace(marker, marker.replace("600", str(FAILOVER_WINDOW_S))))
    config = {"global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
              "rule_files": [str(tmp_path / "alerts.yaml")],
              "scrape_configs": scrape_configs(operator.testbed.kubeconfig, operator.namespace, operator.release)}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log_path = tmp_path / "prometheus.log"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(built("prometheus")), f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        prom = Prometheus(f"http://127.0.0.1:{port}")

        def ready():
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                return urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2).status == 200
            except OSError:
                return False

        wait_until(ready, 60, what="Prometheus ready")
        prom.log = log_path
        yield prom
    finally:
        proc.terminate()
        proc.wait(30)


def test_failover_alert_fires_then_resolves(operator, prometheus):
    tb, namespace = operator.testbed, operator.namespace
    tb.apply(txbroker("mon", replicas=2, failover={"gracePeriodSeconds": 3}), namespace)
    wait_broker(operator, namespace, "mon")
    prom = prometheus

    def scraped():
        """Every broker pod and every operator pod (the leader and its standby) up as a target."""
        ups = {(t["labels"].get("job"), t["labels"].get("pod")): t["health"]
               for t in prom.api("targets")["activeTargets"]}
        brokers = {pod for (job, pod), h in ups.items() if job == "txbroker-brokers" and h == "up"}
        operators = {pod for (job, pod), h in ups.items() if job == "txbroker-operator" and h == "up"}
        want_operators = {p["metadata"]["name"] for p in operator.pods()}
        return brokers == {"mon-0", "mon-1"} and operators == want_operators and len(want_operators) == 2 and ups
    wait_until(scraped, 120, what="both brokers and both operator replicas scraped")
    # Before the failure: one master, the slave in sync, the operator passing.
    wait_until(lambda: prom.value(f'txbroker_role{{namespace="{namespace}", txbroker="mon", role="master"}} == 1'),
               60, what="mon-0 scraped as master")
    wait_until(lambda: prom.value(f'txbroker_replication_slave_in_sync{{namespace="{namespace}", txbroker="mon"}} == 1'),
               60, what="the slave in sync, as its master says")
    wait_until(lambda: prom.value("time() - max(txbroker_operator_last_successful_pass_timestamp_seconds) < 30"), 60,
               what="the operator's passes")
    assert prom.alerts("TxBrokerFailedOver") == []

    # The master's pod is killed (gone, as with its node): the operator promotes mon-1.
    tb.kubectl("-n", namespace, "delete", "pod", "mon-0", "--grace-period=0", "--force", "--wait=false")
    wait_until(lambda: tb.get("txb", "mon", namespace)["status"]["master"] == "mon-1", 120,
               what="the operator to promote mon-1")

    def firing():
        return [a for a in prom.alerts("TxBrokerFailedOver")
                if a["state"] == "firing" and a["labels"].get("namespace") == namespace
                and a["labels"].get("txbroker") == "mon"]
    try:
        alert = wait_until(firing, 120, what="TxBrokerFailedOver firing")[0]
    except TimeoutError:
        raise AssertionError("no TxBrokerFailedOver; Prometheus log:\n" + prom.log.read_text()[-3000:]) from None
    assert alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["runbook_url"].endswith("docs/runbook.md#txbrokerfailedover")
    # the operator's own account of it, and the new master as the brokers report it
    assert prom.value(f'txbroker_operator_failover_duration_seconds_count{{namespace="{namespace}", txbroker="mon"}} == 1')
    wait_until(lambda: prom.value(f'txbroker_role{{namespace="{namespace}", pod="mon-1", role="master"}} == 1'), 60,
               what="mon-1 scraped as master")
    wait_until(lambda: prom.value(f'txbroker_epoch{{namespace="{namespace}", pod="mon-1"}} >= 2'), 60,
               what="mon-1 at the new epoch")

    # Once the failover is older than the window, the alert resolves.
    wait_until(lambda: not prom.alerts("TxBrokerFailedOver"), 240, what="TxBrokerFailedOver resolved")
    # Nothing else is left firing about this TxBroker once it has settled (mon-0 back as a slave).
    wait_until(lambda: tb.get("txb", "mon", namespace)["status"].get("phase") == "Running", 120, what="mon Running")
    wait_until(lambda: not [a for a in prom.api("alerts")["alerts"]
                            if a["labels"].get("txbroker") == "mon" and a["state"] == "firing"], 120,
               what="no alert firing about mon")


# ---- the chart's monitoring objects ------------------------------------------------------------

CHART = str(ROOT / "helm" / "txbroker")
FILES = ROOT / "helm" / "txbroker" / "files"
API = ("--api-versions", "monitoring.coreos.com/v1")


def rendered(tb, *args: str) -> list[dict]:
    out = tb.helm("template", "rel", CHART, "-n", "txb-system", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def monitoring_objects(docs: list[dict]) -> list[tuple[str, str]]:
    return sorted((d["kind"], d["metadata"]["name"]) for d in docs
                  if d["kind"] in ("PodMonitor", "ServiceMonitor", "PrometheusRule")
                  or d["metadata"]["name"].startswith("rel-txbroker-operator-dashboard")
                  or d["metadata"]["name"] == "rel-txbroker-operator-metrics")


def test_chart_renders_monitoring_only_where_the_prometheus_operator_api_is_served(testbed):
    assert monitoring_objects(rendered(testbed)) == []
    docs = rendered(testbed, *API)
    assert monitoring_objects(docs) == [
        ("ConfigMap", "rel-txbroker-operator-dashboard-consumers"),
        ("ConfigMap", "rel-txbroker-operator-dashboard-overview"),
        ("ConfigMap", "rel-txbroker-operator-dashboard-replication"),
        ("ConfigMap", "rel-txbroker-operator-dashboard-transactions"),
        ("PodMonitor", "rel-txbroker-operator-brokers"), ("PrometheusRule", "rel-txbroker-operator"),
        ("Service", "rel-txbroker-operator-metrics"), ("ServiceMonitor", "rel-txbroker-operator")]
    # the rules are alerts.yaml, the runbook's base URL the value's
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((FILES / "alerts.yaml").read_text())
    docs = rendered(testbed, *API, "--set", "monitoring.runbookBaseUrl=https://wiki.example/txbroker")
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert urls and all(u.startswith("https://wiki.example/txbroker#txbroker") for u in urls)
    # the dashboards, for Grafana's sidecar, as the files are
    for d in docs:
        if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]:
            assert d["metadata"]["labels"]["grafana_dashboard"] == "1"
            (name, text), = d["data"].items()
            assert json.loads(text) == json.loads((FILES / "dashboards" / name).read_text())
    pm = next(d for d in docs if d["kind"] == "PodMonitor")["spec"]
    assert pm["selector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "txbroker-operator"}}
    assert pm["namespaceSelector"] == {"any": True} and pm["podMetricsEndpoints"][0]["port"] == "admin"
    sm = next(d for d in docs if d["kind"] == "ServiceMonitor")["spec"]
    assert sm["endpoints"][0]["honorLabels"] is True and sm["endpoints"][0]["port"] == "metrics"


def test_chart_monitoring_options(testbed):
    docs = rendered(testbed, *API, "--set", "operator.watchNamespaces={team-a,team-b}",
                    "--set", "monitoring.labels.release=kube-prometheus-stack",
                    "--set", "monitoring.dashboards.namespace=grafana", "--set", "monitoring.dashboards.folder=txbroker")
    pm = next(d for d in docs if d["kind"] == "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    boards = [d for d in docs if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]]
    assert len(boards) == 4 and all(d["metadata"]["namespace"] == "grafana" for d in boards)
    assert all(d["metadata"]["annotations"]["grafana_folder"] == "txbroker" for d in boards)
    # monitoring off: nothing; dashboards alone without the API: only them
    assert monitoring_objects(rendered(testbed, *API, "--set", "monitoring.enabled=false",
                                       "--set", "monitoring.dashboards.enabled=false")) == []
    only = monitoring_objects(rendered(testbed, "--set", "monitoring.dashboards.enabled=true"))
    assert [k for k, _ in only] == ["ConfigMap"] * 4
    r = testbed.helm("template", "rel", CHART, "--set", "monitoring.dashboards.enabled=maybe", check=False)
    assert r.returncode != 0 and "monitoring" in r.stderr
    testbed.helm("lint", "--strict", CHART, "--set", "monitoring.dashboards.enabled=true")


def test_chart_monitoring_core_objects_pass_server_side_validation(crds, namespace):
    """The Service and the dashboards' ConfigMaps against the real API server (the Prometheus
    Operator's kinds need its CRDs, which this cluster does not serve)."""
    docs = [d for d in rendered(crds, *API) if d["kind"] in ("Service", "ConfigMap")]
    assert len(docs) == 5
    for d in docs:
        d["metadata"]["namespace"] = namespace
    crds.kubectl("apply", "--dry-run=server", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))
