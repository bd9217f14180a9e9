"""The alerting rules (helm/txbroker/files/alerts.yaml) under the real promtool, built from the
Prometheus Go module by testbed/prometheus.sh (`make test` builds it when missing): the file is a
valid rule file, `promtool test rules` passes alert-tests.yaml, every alert is tested there, and
every alert's runbook_url names a section of docs/runbook.md."""

from __future__ import annotations

import re
import subprocess

import yaml

from support.prometheus import built
from tests.conftest import REPO

FILES = REPO / "helm" / "txbroker" / "files"
RULES = FILES / "alerts.yaml"
TESTS = FILES / "alert-tests.yaml"
RUNBOOK = REPO / "docs" / "runbook.md"


def promtool() -> str:
    return str(built("promtool"))


def alerts() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_the_rules_file_is_valid():
    r = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_unit_tests_pass():
    r = subprocess.run([promtool(), "test", "rules", TESTS.name], capture_output=True, text=True, cwd=FILES)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_is_unit_tested_firing_and_quiet():
    tested = yaml.safe_load(TESTS.read_text())["tests"]
    firing = {case["alertname"] for t in tested for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    quiet = {case["alertname"] for t in tested for case in t.get("alert_rule_test", []) if not case.get("exp_alerts")}
    names = {a["alert"] for a in alerts()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested staying quiet"
    assert len(names) == len(alerts()), "an alert name is used twice"


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the markdown's headings."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^a-z0-9 _-]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_every_alert_has_a_runbook_section():
    anchors = _anchors(RUNBOOK.read_text())
    for a in alerts():
        url = a["annotations"]["runbook_url"]
        assert url.split("#")[0].endswith("docs/runbook.md"), url
        assert url.split("#")[1] in anchors, f"{a['alert']}: no section #{url.split('#')[1]} in docs/runbook.md"
        assert {"summary", "description"} <= set(a["annotations"]), a["alert"]
        assert a["labels"]["severity"] in ("warning", "critical"), a["alert"]


def test_the_prepared_bound_gauge_is_absent_while_no_job_is_prepared():
    """TxBrokerPreparedJobNearItsBound fires on a value under an hour: with no job prepared the broker
    exports no sample at all (a 0 would fire it, a +Inf would mean nothing)."""
    from txbroker.broker.metrics import BrokerMetrics

    name = "txbroker_jobs_prepared_nearest_bound_seconds"
    assert name in RULES.read_text()
    m = BrokerMetrics()

    def samples() -> list[str]:
        return [line for line in m.render().decode().splitlines() if line.startswith(name)]

    assert samples() == []
    m.jobs_prepared_nearest_bound.set(1800.0)
    assert samples() == [f"{name} 1800.0"]
    m.jobs_prepared_nearest_bound.set(None)
    assert samples() == []
