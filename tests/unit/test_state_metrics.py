"""The scrape-time collector's cardinality bounds (broker/state_metrics.py): however many queues and
groups a broker holds, per-queue lag and per-group families stay within their bounds, the series
left out are counted, and the largest lags are the ones kept."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from txbroker.broker import state_metrics
from txbroker.protocol.admin import TransactionSettings
from txbroker.store.records import PARKED, PREPARED, PendingTx


def fake_broker(offsets, pending=(), topics=None, end=100):
    state = SimpleNamespace(
        next_lsn=11, durable_lsn=10, topics=topics or {}, key_index_lag=lambda: (0, 10),
        pending_transactions=lambda: list(pending), consumer_offsets=lambda: list(offsets),
        readable_end=lambda topic, queue: end)
    return SimpleNamespace(
        role=SimpleNamespace(role="slave", fenced_by=0, epoch=3, is_master=False), state=state,
        follower=SimpleNamespace(connected=True), leader=None, config=None, idle_poll=None,
        settings=SimpleNamespace(for_group=lambda g: TransactionSettings()))


def collect(broker) -> dict[tuple[str, frozenset], float]:
    r = CollectorRegistry()
    r.register(state_metrics.StateCollector(broker))
    return {(s.name, frozenset(s.labels.items())): s.value for fam in r.collect() for s in fam.samples}


def count(samples, name):
    return sum(1 for n, _ in samples if n == name)


def test_per_queue_lag_is_bounded_keeping_the_largest(monkeypatch):
    monkeypatch.setattr(state_metrics, "MAX_QUEUE_SERIES", 10)
    monkeypatch.setattr(state_metrics, "MAX_GROUPS", 3)
    offsets = [(f"g{g}", "T", q, q) for g in range(5) for q in range(8)]  # 40 queues; lag 100 - q
    samples = collect(fake_broker(offsets))
    assert count(samples, "txbroker_consumer_lag") == 10
    kept = {dict(k)["queue"] for n, k in samples if n == "txbroker_consumer_lag"}
    assert kept <= {"0", "1"}   # the largest lags (queue 0: 100, queue 1: 99)
    assert samples[("txbroker_metrics_series_dropped", frozenset({("family", "txbroker_consumer_lag")}))] == 30
    assert count(samples, "txbroker_consumer_group_lag") == 3
    assert samples[("txbroker_metrics_series_dropped", frozenset({("family", "txbroker_consumer_group_lag")}))] == 2
    assert count(samples, "txbroker_consumer_group_committed_messages_total") == 3
    assert samples[("txbroker_role", frozenset({("role", "slave")}))] == 1
    assert samples[("txbroker_replication_connected", frozenset())] == 1
    assert samples[("txbroker_key_index_offset", frozenset())] == 10
    assert samples[("txbroker_key_index_backlog_messages", frozenset())] == 0
    assert samples[("txbroker_idle_poll_seconds_total", frozenset())] == 0  # (a broker that sleeps at once)


def test_pending_groups_are_bounded(monkeypatch):
    monkeypatch.setattr(state_metrics, "MAX_GROUPS", 2)
    pending = [PendingTx(f"tx{i}", f"pg{i % 4}", i, 1_000, [("T", 0)], state=PARKED if i == 0 else PREPARED)
               for i in range(12)]
    samples = collect(fake_broker([], pending))
    groups = {dict(k)["producer_group"] for n, k in samples if n == "txbroker_group_pending_half_messages"}
    assert len(groups) == 2
    assert samples[("txbroker_metrics_series_dropped",
                    frozenset({("family", "txbroker_group_pending_half_messages")}))] == 2
    assert samples[("txbroker_pending_half_messages_oldest_age_seconds", frozenset())] > 0
