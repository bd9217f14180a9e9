"""The on-call metrics (issue 21) on real brokers: role and epoch, replication lag in records and
seconds, per-group send and transaction counts, check-back answers, pending half messages and
their age, consumer lag per queue, dead letters; and the per-group bound (broker/metrics.py,
broker/state_metrics.py)."""

from __future__ import annotations

import signal
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from support.waiting import wait_until
from txbroker.broker.metrics import OTHER, BoundedLabels
from support.dead_letters import dead_letter
from support.listeners import CommitOnCheck, NeverDecides
from txbroker.client import Message, Producer, PullConsumer, TransactionProducer
from txbroker.client.admin import AdminClient

FAST_CHECKS = ("--check-interval-ms", "300", "--transaction-timeout-ms", "200")


def scrape(b) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(b.admin_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_role_epoch_and_replication_lag(broker_factory):
    master = broker_factory(*FAST_CHECKS, "--broker-name", "m", name="m")
    slave = broker_factory("--role", "slave", "--master", master.address, "--broker-name", "s", *FAST_CHECKS, name="s")
    AdminClient(master.admin_url).create_topic("Lagged", 1)
    m = scrape(master)
    assert value(m, "txbroker_role", role="master") == 1 and value(m, "txbroker_role", role="slave") == 0
    assert value(m, "txbroker_epoch") >= 1
    s = scrape(slave)
    assert value(s, "txbroker_role", role="slave") == 1 and value(s, "txbroker_role", role="master") == 0
    wait_until(lambda: value(scrape(slave), "txbroker_replication_connected") == 1, 20, what="slave connected")
    wait_until(lambda: value(scrape(master), "txbroker_replication_slave_in_sync", slave="s") == 1, 20,
               what="slave in sync")
    assert value(scrape(master), "txbroker_replication_slaves_in_sync") == 1

    # A paused slave falls behind: records, then seconds (at a heartbeat's resolution).
    slave.proc.send_signal(signal.SIGSTOP)
    try:
        with Producer("lag-pg", master.address) as p:
            p.send(Message("Lagged", b"x"))
        wait_until(lambda: (value(scrape(master), "txbroker_replication_lag_records", slave="s") or 0) >= 1
                   and (value(scrape(master), "txbroker_replication_lag_seconds", slave="s") or 0) > 0, 20,
                   what="replication lag in records and seconds")
    finally:
        slave.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: value(scrape(master), "txbroker_replication_lag_records", slave="s") == 0
               and value(scrape(master), "txbroker_replication_lag_seconds", slave="s") == 0, 30,
               what="the slave caught up again")


def test_groups_transactions_consumers_and_dead_letters(broker_factory):
    b = broker_factory(*FAST_CHECKS)
    admin = AdminClient(b.admin_url)
    admin.create_topic("Orders", 2)
    with Producer("pg-plain", b.address) as p:
        sent = [p.send(Message("Orders", f"m{i}".encode())) for i in range(6)]
    with TransactionProducer("pg-check", b.address, CommitOnCheck()) as tp:
        tp.send_message_in_transaction([Message("Orders", b"checked")], None)
        wait_until(lambda: value(scrape(b), "txbroker_checkback_answers_total", answer="commit") == 1, 20,
                   what="a check-back answered commit")
    samples = scrape(b)
    assert value(samples, "txbroker_group_messages_sent_total", producer_group="pg-plain", kind="normal") == 6
    assert value(samples, "txbroker_group_messages_sent_total", producer_group="pg-check", kind="half") == 1
    assert value(samples, "txbroker_group_transactions_total", producer_group="pg-check", outcome="commit") == 1

    with TransactionProducer("pg-stuck", b.address, NeverDecides()) as tp:
        tp.send_message_in_transaction([Message("Orders", b"undecided")], None)
        wait_until(lambda: (value(scrape(b), "txbroker_checkback_answers_total", answer="unknown") or 0) >= 1, 20,
                   what="a check-back answered unknown")
        samples = scrape(b)
        assert value(samples, "txbroker_group_pending_half_messages", producer_group="pg-stuck", state="prepared") == 1
        assert value(samples, "txbroker_group_oldest_pending_age_seconds", producer_group="pg-stuck") > 0
        assert value(samples, "txbroker_pending_half_messages_oldest_age_seconds") > 0
        assert value(samples, "txbroker_group_check_window_seconds", producer_group="pg-stuck") == 0.5

    # Consumer lag per queue: published end minus the committed offset.
    with PullConsumer(b.address) as c:
        c.commit_offsets("cg-metrics", {("Orders", 0): 1, ("Orders", 1): 0})
        committed, maxima = c.committed_offsets("cg-metrics", "Orders")
    want = {q: maxima[q] - committed[q] for q in (0, 1)}
    samples = scrape(b)
    for q in (0, 1):
        assert value(samples, "txbroker_consumer_lag", consumer_group="cg-metrics", topic="Orders", queue=str(q)) == want[q]
    assert value(samples, "txbroker_consumer_group_lag", consumer_group="cg-metrics", topic="Orders") == sum(want.values())
    assert value(samples, "txbroker_consumer_group_committed_messages_total", consumer_group="cg-metrics") == 1

    # A message sent back past its retries is a dead letter of the group.
    dead_letter(b, "cg-metrics", sent[0].msg_id, "Orders")
    assert value(scrape(b), "txbroker_dead_letters_total", consumer_group="cg-metrics") == 1


def test_group_labels_are_bounded():
    from prometheus_client import CollectorRegistry, Counter

    c = Counter("t", "t", ["producer_group", "kind"], registry=CollectorRegistry())
    bound = BoundedLabels(c, ("normal",), limit=3)
    for i in range(10):
        bound(f"g{i}").inc()
    groups = {s.labels["producer_group"]: s.value for s in c.collect()[0].samples if s.name == "t_total"}
    assert groups == {"g0": 1, "g1": 1, "g2": 1, OTHER: 7}


def test_idle_polling_is_counted_and_can_be_turned_off(broker_factory):
    """After each read or write a broker polls before it sleeps (idle_poll_us, 200 by default; not
    while the host's cores are all taken): the time it spends so is what
    txbroker_idle_poll_seconds_total shows; --idle-poll-us 0 sleeps at once."""
    polling = broker_factory(name="polling")
    sleeping = broker_factory("--idle-poll-us", "0", name="sleeping")
    for b in (polling, sleeping):
        AdminClient(b.admin_url).create_topic("Polled", 1)
    with Producer("poll-pg", polling.address) as p, Producer("poll-pg", sleeping.address) as q:
        def polled() -> bool:
            p.send(Message("Polled", b"x"))
            q.send(Message("Polled", b"x"))
            return (value(scrape(polling), "txbroker_idle_poll_seconds_total") or 0) > 0
        wait_until(polled, 30, what="the polling broker counts its polling")
    assert value(scrape(sleeping), "txbroker_idle_poll_seconds_total") == 0
