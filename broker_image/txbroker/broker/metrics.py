"""Prometheus metrics, one registry per broker. Children are bound once so the hot paths pay
for an increment, not a label lookup.

What can be read off the broker's state (role, epoch, replication lag, consumer lag, pending half
messages and their age, dead letters) is computed when Prometheus scrapes, by
broker/state_metrics.py's collector, never on a hot path. The few per-group counters kept here
(messages sent and transactions ended per producer group) cost a dict lookup per request and are
bounded: at most MAX_GROUP_LABELS groups get a series of their own, later ones count under the
group "_other" (see BoundedLabels)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from txbroker.broker.loop_metrics import LoopCounterFamily, LoopHistogramFamily

MAX_GROUP_LABELS = 100  # producer groups with series of their own; the rest count as OTHER
OTHER = "_other"

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class BoundedLabels:
    """Children of a metric whose first label is a group name, bound on first use; once `limit`
    groups have one, a new group's counts go to the OTHER child (the series' number stays bounded
    whoever connects; the dropped names are not remembered, so memory stays bounded too)."""

    __slots__ = ("_metric", "_rest", "_limit", "_children", "_other")

    def __init__(self, metric, rest: tuple[str, ...] = (), limit: int = MAX_GROUP_LABELS):
        self._metric, self._rest, self._limit = metric, rest, limit
        self._children: dict[str, object] = {}
        self._other = None

    def __call__(self, group: str):
        child = self._children.get(group)
        if child is None:
            if len(self._children) < self._limit:
                child = self._children[group] = self._metric.labels(group, *self._rest)
            else:
                if self._other is None:
                    self._other = self._metric.labels(OTHER, *self._rest)
                child = self._other
        return child


class OptionalGauge:
    """A gauge for a quantity that does not always exist (the nearest bound while no job is
    prepared): while unset (None) its family has no sample, as the collector's families that may be
    empty (state_metrics.py), so an alert on it sees nothing, never a 0 or +Inf standing in."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry):
        self._name, self._doc = name, documentation
        self.value: float | None = None
        registry.register(self)

    def set(self, value: float | None) -> None:
        self.value = value

    def describe(self):
        return [GaugeMetricFamily(self._name, self._doc)]

    def collect(self):
        family = GaugeMetricFamily(self._name, self._doc)
        if self.value is not None:
            family.add_metric([], self.value)
        yield family


class BrokerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # Updated per request or per write: loop_metrics.py's lock-free families (same exposition).
        sent = LoopCounterFamily("txbroker_messages_sent", "Messages stored, by kind", ["kind"], registry=r)
        self.sent_normal = sent.labels("normal")
        self.sent_half = sent.labels("half")
        tx = LoopCounterFamily("txbroker_transactions", "Transactions finished, by outcome", ["outcome"], registry=r)
        self.tx_commit = tx.labels("commit")
        self.tx_rollback = tx.labels("rollback")
        self.tx_park = tx.labels("park")
        self.tx_duplicate_end = Counter("txbroker_end_transaction_duplicates",
                                        "END_TRANSACTION requests for an already finished transaction", registry=r)
        self.pending = Gauge("txbroker_pending_half_messages", "Transactions prepared and not finished", registry=r)
        self.parked = Gauge("txbroker_parked_transactions", "Transactions parked after checkMax checks", registry=r)
        # Coordinated transactions (broker/transaction/jobs.py).
        self.jobs_opened = Counter("txbroker_jobs_opened", "Coordinated transactions (jobs) opened", registry=r)
        self.jobs_decided = Counter("txbroker_jobs_decided", "Jobs decided, by decision and by whom (client, "
                                    "deadline: aborted undecided at the deadline, admin)", ["decision", "by"], registry=r)
        self.job_members_ended = Counter("txbroker_job_members_resolved", "Member transactions the broker ended "
                                         "from their job's decision, by outcome", ["outcome"], registry=r)
        self.job_decision_to_visible = Histogram(
            "txbroker_job_decision_to_visible_seconds", "From a job's decision to its last member ended and published",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.store_damaged = Counter("txbroker_store_damaged", "Reads, or writes RocksDB refused, that met a "
                                     "damaged store file (the broker stops; a slave is seeded from its master at its "
                                     "next start)", registry=r)
        self.job_groups_visible = Histogram(
            "txbroker_job_groups_visible_seconds", "At a job's home: from its decision to every group it spans having "
            "made its kept members visible, as the home learns it (checked every second): how long a consumer of "
            "several groups may see the job on some groups and not yet on others",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300), registry=r)
        self.jobs_undecided = Gauge("txbroker_jobs_undecided", "Jobs open or prepared, not yet decided", ["state"],
                                    registry=r)
        self.jobs_prepared_nearest_bound = OptionalGauge(
            "txbroker_jobs_prepared_nearest_bound_seconds", "Seconds until the nearest bound of a PREPARED job (the "
            "broker aborts it then unless decided); absent while no job is prepared", r)
        # Per producer group (bounded: BoundedLabels): messages stored, transactions ended.
        group_sent = LoopCounterFamily("txbroker_group_messages_sent", "Messages stored, by producer group and "
                                       f"kind (at most {MAX_GROUP_LABELS} groups by name, the rest as {OTHER})",
                                       ["producer_group", "kind"], registry=r)
        self.group_sent_normal = BoundedLabels(group_sent, ("normal",))
        self.group_sent_half = BoundedLabels(group_sent, ("half",))
        group_tx = LoopCounterFamily("txbroker_group_transactions", "Transactions finished, by producer group and "
                                     f"outcome (at most {MAX_GROUP_LABELS} groups by name, the rest as {OTHER})",
                                     ["producer_group", "outcome"], registry=r)
        self.group_tx_commit = BoundedLabels(group_tx, ("commit",))
        self.group_tx_rollback = BoundedLabels(group_tx, ("rollback",))
        answers = LoopCounterFamily("txbroker_checkback_answers", "Answers to check-backs (END_TRANSACTION marked "
                                    "as from a check), by the state answered: commit, rollback, unknown", ["answer"],
                                    registry=r)
        self.checkback_answers = {0: answers.labels("unknown"), 1: answers.labels("commit"),
                                  2: answers.labels("rollback")}
        self.checkback_answer_invalid = answers.labels("invalid")
        self.checkbacks = LoopCounterFamily("txbroker_checkbacks_sent", "CHECK_TRANSACTION_STATE requests sent",
                                            registry=r)
        self.checkbacks_unanswerable = Counter(
            "txbroker_checkbacks_without_producer", "Checks counted with no live producer of the group", registry=r)
        self.check_scan_seconds = Histogram("txbroker_check_scan_seconds", "Duration of one check-back scan",
                                            buckets=_LATENCY_BUCKETS, registry=r)
        self._latency = LoopHistogramFamily("txbroker_request_latency_seconds",
                                            "Request handling latency until the answer", ["request"],
                                            buckets=_LATENCY_BUCKETS, registry=r)
        self._latency_children: dict[int, object] = {}
        self.requests_rejected = Counter("txbroker_requests_rejected", "Requests answered with an error code",
                                         ["code"], registry=r)
        for code in ("SLAVE_NOT_AVAILABLE", "FLUSH_SLAVE_TIMEOUT"):  # SYNC refusals: at 0 before the first,
            self.requests_rejected.labels(code)                    # so rate() sees the first one
        self.flush_batch = LoopHistogramFamily("txbroker_flush_batch_records", "Records per group-commit write",
                                               buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), registry=r)
        self.flush_seconds = LoopHistogramFamily("txbroker_flush_seconds", "Duration of one group-commit write",
                                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.retention_deleted = Counter("txbroker_retention_deleted_records",
                                         "Log records deleted by retention", registry=r)
        self.log_start = Gauge("txbroker_log_start_offset", "The log holds every record from this LSN on", registry=r)
        self.log_bytes = Gauge("txbroker_log_retained_bytes",
                               "Bytes of log records written since the retention cutoff (about the log's size)",
                               registry=r)
        self.loop_lag = Histogram("txbroker_event_loop_lag_seconds", "How late the broker's event loop ran a 1 s timer",
                                  buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.connections = Gauge("txbroker_connections", "Open data-plane connections", registry=r)
        # Security and limits (tracker issue 9).
        self.auth_failures = Counter("txbroker_auth_failures", "Requests or connections refused as unauthenticated, "
                                     "by reason", ["reason"], registry=r)
        self.authentications = Counter("txbroker_authentications", "Connections authenticated", registry=r)
        self._access_denied = Counter("txbroker_access_denied", "Requests refused NO_PERMISSION, by the right missing",
                                      ["right"], registry=r)
        self.credentials_reloads = Counter("txbroker_credentials_reloads", "Credentials file reloads, by result",
                                           ["result"], registry=r)
        self.limit_refusals = Counter("txbroker_limit_refusals", "Requests or connections refused by a limit",
                                      ["limit"], registry=r)
        self.connections_closed = Counter("txbroker_connections_closed_by_broker",
                                          "Connections the broker closed, by reason", ["reason"], registry=r)
        self.plaintext_refused = Counter("txbroker_plaintext_refused", "Plaintext connections to a TLS-only port, "
                                         "by plane", ["plane"], registry=r)
        self.tls_handshake_failures = Counter("txbroker_tls_handshake_failures", "TLS handshakes that failed, by plane",
                                              ["plane"], registry=r)
        self.unacked_bytes = Gauge("txbroker_unacked_request_bytes",
                                   "Bytes of requests received and not yet answered, all connections", registry=r)

    def access_denied_hook(self, right: str) -> None:
        self._access_denied.labels(right).inc()

    def latency(self, request_name: str):
        child = self._latency_children.get(request_name)
        if child is None:
            child = self._latency_children[request_name] = self._latency.labels(request_name)
        return child

    def observe_flush(self, records: int, seconds: float) -> None:
        self.flush_batch.observe(records)
        self.flush_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
