"""The CRDs in crds/ against a real API server: installed, defaulted, validated, printed."""

from __future__ import annotations

import json

import pytest
from cluster import ROOT

pytestmark = pytest.mark.e2e


def txb(name: str, **spec) -> dict:
    return {"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxBroker", "metadata": {"name": name},
            "spec": {"image": "txbroker/broker:0.2.0", **spec}}


def txpg(name: str, **spec) -> dict:
    return {"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxProducerGroup", "metadata": {"name": name},
            "spec": spec}


def refused(testbed, manifest: dict, namespace: str) -> str:
    """Create `manifest`; it must be refused. Returns the server's message."""
    r = testbed.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(manifest), check=False)
    assert r.returncode != 0, f"accepted: {manifest}"
    assert "is invalid" in r.stderr or "Invalid value" in r.stderr or "Unsupported value" in r.stderr, r.stderr
    return r.stderr


def test_apply_crds_and_list_them(testbed):
    # under the crds fixture's lock: two applies at once both find nothing and both create, and the
    # second fails AlreadyExists (it took down every test of the other worker that needed the CRDs)
    with testbed.exclusive("crds"):
        out = testbed.kubectl("apply", "-f", str(ROOT / "crds")).stdout
    assert "txbrokers.txbroker.dev" in out and "txproducergroups.txbroker.dev" in out
    testbed.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/txbrokers.txbroker.dev", "crd/txproducergroups.txbroker.dev")
    names = testbed.kubectl("get", "crd", "-o", "name").stdout.split()
    assert "customresourcedefinition.apiextensions.k8s.io/txbrokers.txbroker.dev" in names
    assert "customresourcedefinition.apiextensions.k8s.io/txproducergroups.txbroker.dev" in names
    # short names and categories resolve
    resources = testbed.kubectl("api-resources", "--api-group=txbroker.dev", "-o", "wide").stdout
    assert "txb" in resources and "txpg" in resources


def test_defaults_are_applied(crds, namespace):
    crds.apply(txb("defaults"), namespace)
    spec = crds.get("txb", "defaults", namespace)["spec"]
    assert spec["replicas"] == 1
    assert spec["replication"] == "ASYNC" and spec["flush"] == "ASYNC"
    assert spec["transaction"] == {"checkIntervalSeconds": 60, "timeoutSeconds": 6, "checkMax": 15}
    crds.apply(txpg("orders", brokerRef={"name": "defaults"}), namespace)
    pg = crds.get("txpg", "orders", namespace)["spec"]
    assert pg["checkMode"] == "connection" and pg["checkMax"] == 15 and pg["checkIntervalSeconds"] == 60


@pytest.mark.parametrize("spec, field, words", [
    ({"replicas": "three"}, "spec.replicas", "must be of type integer"),
    ({"replicas": 0}, "spec.replicas", "should be greater than or equal to 1"),
    ({"replicas": 10}, "spec.replicas", "should be less than or equal to 9"),
    ({"replication": "FAST"}, "spec.replication", 'Unsupported value: "FAST"'),
    ({"flush": "sync"}, "spec.flush", 'Unsupported value: "sync"'),
    ({"transaction": {"checkMax": 1001}}, "spec.transaction.checkMax", "less than or equal to 1000"),
    ({"transaction": {"checkIntervalSeconds": 0}}, "spec.transaction.checkIntervalSeconds", "greater than or equal to 1"),
    ({"storage": {"size": "ten gigs"}}, "spec.storage.size", "should match"),
    ({"authSecretRef": {}}, "spec.authSecretRef.name", "Required value"),
    ({"replication": "SYNC"}, "spec.replication", "replication SYNC needs replicas of at least 2"),
    ({"failover": {"gracePeriodSeconds": 0}}, "spec.failover.gracePeriodSeconds", "greater than or equal to 1"),
])
def test_invalid_txbroker_is_refused_naming_the_field(crds, namespace, spec, field, words):
    msg = refused(crds, txb("bad", **spec), namespace)
    assert field in msg and words in msg, msg


def test_txbroker_without_image_is_refused(crds, namespace):
    bad = txb("noimage")
    del bad["spec"]["image"]
    msg = refused(crds, bad, namespace)
    assert "spec.image" in msg and "Required value" in msg, msg


@pytest.mark.parametrize("spec, field, words", [
    ({}, "spec.brokerRef", "Required value"),
    ({"brokerRef": {"name": "b"}, "checkMode": "carrier-pigeon"}, "spec.checkMode", "Unsupported value"),
    ({"brokerRef": {"name": "b"}, "checkMax": 0}, "spec.checkMax", "greater than or equal to 1"),
    ({"brokerRef": {"name": "b"}, "checkMode": "http"}, "spec.webhookUrl", "webhookUrl is required when checkMode is http"),
    ({"brokerRef": {"name": "b"}, "groupName": "no spaces"}, "spec.groupName", "should match"),
])
def test_invalid_txproducergroup_is_refused_naming_the_field(crds, namespace, spec, field, words):
    msg = refused(crds, txpg("bad", **spec), namespace)
    assert field in msg and words in msg, msg


def test_printer_columns_and_status_subresource(crds, namespace):
    crds.apply(txb("shown", replicas=3), namespace)
    # status is a subresource: a spec write does not touch it, a /status write does
    crds.kubectl("-n", namespace, "patch", "txb", "shown", "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"phase": "Running", "master": "shown-0", "epoch": 2,
                                              "masters": "g0=shown-0", "version": "0.2.0"}}))
    table = crds.kubectl("-n", namespace, "get", "txb", "shown").stdout.splitlines()
    assert table[0].split() == ["NAME", "REPLICAS", "MASTER", "EPOCH", "PHASE", "GROUPS", "MASTERS", "VERSION", "AGE"]
    # groups: the default
    assert table[1].split()[:8] == ["shown", "3", "shown-0", "2", "Running", "1", "g0=shown-0", "0.2.0"]

    crds.apply(txpg("pg", brokerRef={"name": "shown"}, checkIntervalSeconds=5), namespace)
    crds.kubectl("-n", namespace, "patch", "txpg", "pg", "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"pending": 4, "applied": [{"name": "shown-0", "generation": 1}],
                                              "conditions": [{"type": "Applied", "status": "True"}]}}))
    table = crds.kubectl("-n", namespace, "get", "txpg", "pg").stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "BROKER", "CHECK-INTERVAL", "PENDING", "APPLIED"]
    assert table[1].split()[:5] == ["pg", "shown", "5", "4", "True"]


def test_status_is_validated_too(crds, namespace):
    crds.apply(txb("st"), namespace)
    r = crds.kubectl("-n", namespace, "patch", "txb", "st", "--subresource=status", "--type=merge",
                     "-p", json.dumps({"status": {"conditions": [{"type": "Sleepy", "status": "True"}]}}),
                     check=False)
    assert r.returncode != 0 and "status.conditions[0].type" in r.stderr, r.stderr


def test_crds_in_chart_are_the_top_level_ones():
    for name in ("txbroker.yaml", "txproducergroup.yaml"):
        chart = ROOT / "helm" / "txbroker" / "crds" / name
        assert chart.read_text() == (ROOT / "crds" / name).read_text()

