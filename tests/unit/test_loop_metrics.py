"""The loop-only counters and histograms scrape exactly as prometheus_client's own would: the same
samples for the same updates (bucket edges included), its `_created` samples aside."""

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from txbroker.broker.loop_metrics import LoopCounterFamily, LoopHistogramFamily

BUCKETS = (0.0001, 0.001, 0.01, 0.1, 1, 2.5)
VALUES = (0.0, 0.0001, 0.00010001, 0.0005, 0.001, 0.05, 1, 2.5, 2.50001, 7, 1e9, -1)


def exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_a_labelled_histogram_scrapes_as_prometheus_clients():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogramFamily("t_latency_seconds", "latency", ["request"], buckets=BUCKETS, registry=ours)
    reference = Histogram("t_latency_seconds", "latency", ["request"], buckets=BUCKETS, registry=theirs)
    for i, v in enumerate(VALUES):
        for name in ("SEND", "END") if i % 2 else ("SEND",):
            loop.labels(name).observe(v)
            reference.labels(name).observe(v)
    assert exposition(ours) == exposition(theirs)
    assert 't_latency_seconds_bucket{le="0.0001",request="SEND"} 3.0' in exposition(ours)  # 0, edge, and -1


def test_unlabelled_histogram_and_counters_scrape_as_prometheus_clients():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    h = LoopHistogramFamily("t_batch_records", "records", buckets=(1, 2, 4), registry=ours)
    href = Histogram("t_batch_records", "records", buckets=(1, 2, 4), registry=theirs)
    c = LoopCounterFamily("t_checks", "checks", registry=ours)
    cref = Counter("t_checks", "checks", registry=theirs)
    kinds = LoopCounterFamily("t_sent", "sent", ["group", "kind"], registry=ours)
    kref = Counter("t_sent", "sent", ["group", "kind"], registry=theirs)
    for n in (1, 3, 3, 9):
        h.observe(n)
        href.observe(n)
        c.inc(n)
        cref.inc(n)
        kinds.labels("g", "half").inc(n)
        kref.labels("g", "half").inc(n)
    kinds.labels("g", "normal")  # bound, never incremented: a 0 sample, as theirs
    kref.labels("g", "normal")
    assert exposition(ours) == exposition(theirs)
    assert "t_checks_total 16.0" in exposition(ours)


def test_wrong_label_count_and_unsorted_buckets_are_refused_by_name():
    r = CollectorRegistry()
    with pytest.raises(ValueError, match="t_x: 1 label values needed"):
        LoopCounterFamily("t_x", "x", ["kind"], registry=r).labels("a", "b")
    with pytest.raises(ValueError, match="t_y: buckets must increase"):
        LoopHistogramFamily("t_y", "y", buckets=(1, 0.5), registry=r)


def test_updating_a_labelled_family_without_its_labels_names_what_is_missing():
    registry = CollectorRegistry()
    counter = LoopCounterFamily("t_requests", "requests", ["request"], registry=registry)
    histogram = LoopHistogramFamily("t_seconds", "latency", ["request"], buckets=BUCKETS, registry=registry)
    with pytest.raises(ValueError, match=r"t_requests has labels \['request'\]: update a child"):
        counter.inc()
    with pytest.raises(ValueError, match=r"t_seconds has labels \['request'\]"):
        histogram.observe(0.1)
    counter.labels("SEND").inc()
    assert 't_requests_total{request="SEND"} 1.0' in exposition(registry)  # nothing half-counted
