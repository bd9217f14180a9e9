"""The chart's web console (helm/txbroker/templates/console.yaml): off by default; on, a Deployment
running `txbroker console` against every broker pod's admin API, a Service, and a Role that may only
list Events; the credentials and TLS Secrets mounted as files, never as flags."""

from __future__ import annotations

import pytest
import yaml
from cluster import ROOT

pytestmark = pytest.mark.e2e

CHART = str(ROOT / "helm" / "txbroker")


def render(testbed, *sets: str) -> list[dict]:
    args = [a for s in sets for a in ("--set", s)]
    out = testbed.helm("template", "rel", CHART, "-n", "txs", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def console_objects(docs: list[dict]) -> dict:
    return {d["kind"]: d for d in docs if d["metadata"]["name"] == "rel-txbroker-console"}


def test_console_is_off_by_default(testbed):
    assert console_objects(render(testbed)) == {}


def test_console_renders_a_deployment_a_service_and_a_read_only_role(testbed):
    objs = console_objects(render(testbed, "console.enabled=true", "txbroker.create=true", "txbroker.replicas=2"))
    assert sorted(objs) == ["Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    assert objs["Role"]["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}]
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["txbroker", "console"]
    assert "--admin=http://rel-0.rel.txs.svc:10912,http://rel-1.rel.txs.svc:10912" in c["args"]
    assert "--broker=rel-master.txs.svc:10911" in c["args"] and "--listen=0.0.0.0:8090" in c["args"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and pod["securityContext"]["runAsNonRoot"] is True
    assert objs["Service"]["spec"]["ports"][0]["targetPort"] == "http"


def test_console_service_account_and_tls_are_files(testbed):
    objs = console_objects(render(testbed, "console.enabled=true", "console.credentialsSecret=ops",
                                  "console.tlsSecret=tls", "console.events=false"))
    assert "Role" not in objs and objs["ServiceAccount"]["automountServiceAccountToken"] is False
    (c,) = objs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert c["args"][0].startswith("--admin=https://rel-0.rel.txs.svc:10912")
    assert "--secret-file=/etc/txbroker/console-credentials/secret-key" in c["args"]
    assert "--tls-ca=/etc/txbroker/console-tls/ca.crt" in c["args"]
    assert not any("secret" in a.lower() and "=" in a and "file" not in a for a in c["args"])
    assert c["env"] == [{"name": "TXBROKER_ACCESS_KEY",
                         "valueFrom": {"secretKeyRef": {"name": "ops", "key": "access-key"}}}]


def test_console_values_are_checked(testbed):
    r = testbed.helm("template", "rel", CHART, "--set", "console.bogus=1", check=False)
    assert r.returncode != 0 and "console" in r.stderr
    testbed.helm("lint", "--strict", CHART, "--set", "console.enabled=true")
