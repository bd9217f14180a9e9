"""The operator's own metrics (operator/txbroker_operator/metrics.py): a pass is counted and timed by
its result, a failover by its reason with its duration, a blocked one while it lasts, and a
deleted TxBroker's series go; the endpoint serves them."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from txbroker_operator import metrics, reconcile

from prometheus_client import REGISTRY


def sample(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_a_pass_is_counted_and_timed_by_its_result(monkeypatch):
    ns, name = "m-ns", "m-pass"
    monkeypatch.setattr(reconcile.kube, "get_txbroker", lambda n, x: {"metadata": {"namespace": n, "name": x}})
    monkeypatch.setattr(reconcile.Pass, "run", lambda self: {"phase": "Running"})
    before = time.time()
    reconcile.sync({"metadata": {"namespace": ns, "name": name}}, reconcile.logging.getLogger("t"))
    assert sample("txbroker_operator_reconciles_total", namespace=ns, txbroker=name, result="ok") == 1
    assert sample("txbroker_operator_reconcile_duration_seconds_count", namespace=ns, txbroker=name) == 1
    assert sample("txbroker_operator_last_successful_pass_timestamp_seconds") >= before

    def broken(self):
        raise RuntimeError("API server gone")

    monkeypatch.setattr(reconcile.Pass, "run", broken)
    with pytest.raises(RuntimeError):
        reconcile.sync({"metadata": {"namespace": ns, "name": name}}, reconcile.logging.getLogger("t"))
    assert sample("txbroker_operator_reconciles_total", namespace=ns, txbroker=name, result="error") == 1


def test_failover_blocked_and_forget():
    ns, name = "m-ns", "m-failover"
    metrics.master_state(ns, name, time.time() - 3, "FailoverBlocked")
    assert sample("txbroker_operator_failover_blocked", namespace=ns, txbroker=name) == 1
    assert sample("txbroker_operator_master_unavailable", namespace=ns, txbroker=name) == 1
    assert sample("txbroker_operator_failovers_blocked_total", namespace=ns, txbroker=name,
                  reason="FailoverBlocked") == 1
    metrics.failed_over(ns, name, "FailedOver", time.time() - 12)
    metrics.master_state(ns, name, None)
    assert sample("txbroker_operator_failovers_total", namespace=ns, txbroker=name, reason="FailedOver") == 1
    assert sample("txbroker_operator_failover_duration_seconds_sum", namespace=ns, txbroker=name) >= 12
    assert sample("txbroker_operator_failover_blocked", namespace=ns, txbroker=name) == 0
    metrics.drift_repaired("Service")
    assert sample("txbroker_operator_drift_repairs_total", kind="Service") >= 1
    metrics.forget(ns, name)
    assert sample("txbroker_operator_failovers_total", namespace=ns, txbroker=name, reason="FailedOver") is None
    assert sample("txbroker_operator_master_unavailable", namespace=ns, txbroker=name) is None


def test_the_endpoint_serves_them(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    registry = CollectorRegistry()
    from prometheus_client import Gauge
    Gauge("txbroker_operator_probe", "t", registry=registry).set(7)
    monkeypatch.setenv(metrics.PORT_ENV, str(port))
    assert metrics.serve(registry) == port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        names = {f.name for f in text_string_to_metric_families(r.read().decode())}
    assert "txbroker_operator_probe" in names
    monkeypatch.setenv(metrics.PORT_ENV, "0")
    assert metrics.serve(registry) is None
