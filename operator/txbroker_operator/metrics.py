"""The operator's own Prometheus metrics, served on their own port (TXBROKER_OPERATOR_METRICS_PORT,
default 8081; 0 turns the endpoint off) from the startup handler (handlers.py), whichever way
the operator was started; with leader election, from the start of the process (__main__), so a
standby replica serves them too (txbroker_operator_leader 0). Kopf's liveness endpoint is left alone.

    txbroker_operator_leader                                         1 while this process acts (holds
                                                                     the leader-election Lease, or runs
                                                                     without election), 0 on standby

    txbroker_operator_reconciles_total{namespace,txbroker,result}   passes over a TxBroker: ok, error
    txbroker_operator_reconcile_duration_seconds{namespace,txbroker} how long one pass took
    txbroker_operator_failovers_total{namespace,txbroker,reason}     promotions: FailedOver, or a
                                                                     planned switchover's reason
    txbroker_operator_failover_duration_seconds{namespace,txbroker}  from the master found not serving
                                                                     to its successor promoted
    txbroker_operator_failovers_blocked_total{namespace,txbroker,reason}  passes that found the master
                                                                     lost and could not fail over
    txbroker_operator_failover_blocked{namespace,txbroker}           1 while that lasts
    txbroker_operator_master_unavailable{namespace,txbroker}         1 while the master is not serving
    txbroker_operator_drift_repairs_total{kind}                      someone's edit of an owned object
                                                                     put back
    txbroker_operator_last_successful_pass_timestamp_seconds         when a pass last completed
                                                                     (a TxBroker's, or the periodic
                                                                     round with none to pass over)

Labels name TxBrokers (bounded by what the cluster holds; a deleted one's series are removed by
`forget`), object kinds and Kopf-free reasons, never pods or groups.
"""

from __future__ import annotations

import logging
import os
import time

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

PORT_ENV = "TXBROKER_OPERATOR_METRICS_PORT"
DEFAULT_PORT = 8081

_DURATIONS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_FAILOVER = (1, 2.5, 5, 10, 15, 20, 30, 45, 60, 120, 300)
_KEY = ["namespace", "txbroker"]

reconciles = Counter("txbroker_operator_reconciles", "Passes over a TxBroker, by result", _KEY + ["result"])
reconcile_seconds = Histogram("txbroker_operator_reconcile_duration_seconds", "Duration of one pass over a TxBroker",
                              _KEY, buckets=_DURATIONS)
failovers = Counter("txbroker_operator_failovers", "Promotions of a new master, by reason (FailedOver: the master "
                    "was lost; otherwise a planned switchover)", _KEY + ["reason"])
failover_seconds = Histogram("txbroker_operator_failover_duration_seconds", "From the master found not serving to "
                             "its successor promoted", _KEY, buckets=_FAILOVER)
blocked = Counter("txbroker_operator_failovers_blocked", "Passes that found the master lost and could not fail over, "
                  "by reason", _KEY + ["reason"])
blocked_now = Gauge("txbroker_operator_failover_blocked", "1 while a lost master cannot be failed over", _KEY)
unavailable = Gauge("txbroker_operator_master_unavailable", "1 while the TxBroker's master is not serving", _KEY)
drift_repairs = Counter("txbroker_operator_drift_repairs", "Edits of objects the operator owns, put back, by kind",
                        ["kind"])
# From the TxBroker's status, so whichever operator process leads next exports the same time: the
# failover alert rests on it, not on a counter a newly elected leader creates already at 1.
last_failover_at = Gauge("txbroker_operator_last_failover_timestamp_seconds",
                         "Unix time of the TxBroker's last failover (status.lastFailover)", _KEY)
last_success = Gauge("txbroker_operator_last_successful_pass_timestamp_seconds",
                     "Unix time a pass last completed without error")

leader = Gauge("txbroker_operator_leader", "1 while this operator process acts (holds the leader-election Lease, "
               "or runs without leader election), 0 while it stands by")

_children: set[tuple[object, tuple[str, ...]]] = set()  # (metric, labels) bound per TxBroker, for forget


def _child(metric, *labels: str):
    _children.add((metric, labels))
    return metric.labels(*labels)


def serve(registry: CollectorRegistry = REGISTRY) -> int | None:
    """Start the endpoint (a daemon thread); returns the port, or None when turned off."""
    port = int(os.environ.get(PORT_ENV, str(DEFAULT_PORT)))
    if port == 0:
        return None
    if port in _serving:    # started before Kopf (leader election): the startup handler's call finds it
        return port
    start_http_server(port, registry=registry)
    _serving.add(port)
    log.info("metrics on :%d/metrics", port)
    return port


_serving: set[int] = set()


def passed(namespace: str, name: str, seconds: float, ok: bool) -> None:
    _child(failovers, namespace, name, "FailedOver")  # at 0 from the first pass: increase() sees the first one
    _child(reconciles, namespace, name, "ok" if ok else "error").inc()
    _child(reconcile_seconds, namespace, name).observe(seconds)
    if ok:
        last_success.set(time.time())


def round_done() -> None:
    """The periodic round finished without error (also with nothing to pass over)."""
    last_success.set(time.time())


def master_state(namespace: str, name: str, unavailable_since: float | None, blocked_reason: str = "") -> None:
    _child(unavailable, namespace, name).set(1 if unavailable_since is not None else 0)
    _child(blocked_now, namespace, name).set(1 if blocked_reason else 0)
    if blocked_reason:
        _child(blocked, namespace, name, blocked_reason).inc()


def failed_over(namespace: str, name: str, reason: str, unavailable_since: float | None) -> None:
    _child(failovers, namespace, name, reason).inc()
    if unavailable_since is not None:
        _child(failover_seconds, namespace, name).observe(max(0.0, time.time() - unavailable_since))


def last_failover(namespace: str, name: str, at: float) -> None:
    _child(last_failover_at, namespace, name).set(at)


def drift_repaired(kind: str) -> None:
    drift_repairs.labels(kind).inc()


def forget(namespace: str, name: str) -> None:
    """A deleted TxBroker: its series go (their number stays what the cluster holds)."""
    for metric, labels in list(_children):
        if labels[:2] == (namespace, name):
            metric.remove(*labels)
            _children.discard((metric, labels))
