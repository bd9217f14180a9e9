"""Metrics read off the broker's state when Prometheus scrapes (a prometheus_client collector):
what an on-call engineer graphs and alerts on, at no cost to the hot paths (send, commit, the
check-back scan), which never touch this module.

    txbroker_role{role}                       1 for what this broker is now: master, slave, fenced
    txbroker_epoch                            its epoch (bumped by each failover)
    txbroker_log_end_offset                   last LSN written; txbroker_durable_offset: published
    txbroker_key_index_backlog_messages       messages of keyed records readable, not yet found by key
                                              (the key index is written behind the log); and
                                              txbroker_key_index_offset: last LSN whose keys are written
    txbroker_replication_lag_records{slave}   master: records a slave has not acknowledged
    txbroker_replication_lag_seconds{slave}   master: how long ago the first of them was written
    txbroker_replication_slave_in_sync{slave} master: 1 when it follows live (a SYNC write counts it)
    txbroker_replication_slaves_in_sync       master: slaves in sync; _sync_replicas_required: SYNC's
                                              quorum (0 under ASYNC)
    txbroker_replication_connected            slave: 1 when connected to its master
    txbroker_pending_half_messages_oldest_age_seconds  oldest prepared, undecided transaction
                                              outside jobs (parked ones are counted apart)
    txbroker_group_pending_half_messages{producer_group,state}  prepared / parked, per group
    txbroker_group_oldest_pending_age_seconds{producer_group}   outside jobs
    txbroker_group_check_window_seconds{producer_group}  timeout + one check interval: a half
                                              message older has been checked back and is undecided
    txbroker_consumer_lag{consumer_group,topic,queue}  published end - committed offset
    txbroker_consumer_group_lag{consumer_group,topic}  the same summed over the topic's queues
    txbroker_consumer_group_committed_messages_total{consumer_group}  committed offsets summed: its
                                              rate is the group's consumption rate
    txbroker_dead_letters_total{consumer_group}  messages stored in the group's %DLQ% topic (0 for a
                                              group with committed offsets and no dead letter yet)
    txbroker_idle_poll_seconds_total          the event loop's time polling, with nothing to do, before
                                              it sleeps (idle_poll_us): the CPU that polling costs
    txbroker_metrics_series_dropped{family}   series left out of this scrape by the bounds below

Cardinality: groups come and go with clients, queues with topics. Per-queue lag is kept for at most
MAX_QUEUE_SERIES (group, topic, queue) triples, per-group families for at most MAX_GROUPS groups
(the ones with the most lag / pending first); what is left out is counted in
txbroker_metrics_series_dropped, so a dashboard can say it is partial."""

from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from txbroker.protocol.names import DLQ_PREFIX, RETRY_PREFIX
from txbroker.store.records import PARKED

MAX_QUEUE_SERIES = 1000
MAX_GROUPS = 100
ROLES = ("master", "slave", "fenced")
BOUNDED = ("txbroker_group_pending_half_messages", "txbroker_consumer_lag", "txbroker_consumer_group_lag",
           "txbroker_dead_letters")


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class StateCollector:
    """Registered in the broker's registry; `collect` runs on the event loop, in the /metrics handler."""

    def __init__(self, broker):
        self._b = broker

    def describe(self):
        return []  # computed per scrape; the registry need not call collect at registration

    def collect(self):
        b = self._b
        dropped = dict.fromkeys(BOUNDED, 0)
        yield from self._role(b)
        yield from self._replication(b)
        yield from self._pending(b, dropped)
        yield from self._consumers(b, dropped)
        family = _gauge("txbroker_metrics_series_dropped", "Series left out of this scrape by the metrics' "
                        "cardinality bounds, by family", ["family"])
        for name, n in dropped.items():
            family.add_metric([name], n)
        yield family

    # ---- role and replication ---------------------------------------------------------------

    def _role(self, b):
        role = _gauge("txbroker_role", "1 for the broker's role now: master, slave, fenced (a deposed master)",
                      ["role"])
        now = "fenced" if b.role.fenced_by else b.role.role
        for r in ROLES:
            role.add_metric([r], 1.0 if r == now else 0.0)
        yield role
        yield GaugeMetricFamily("txbroker_epoch", "The broker's epoch (each failover bumps it)", value=b.role.epoch)
        yield GaugeMetricFamily("txbroker_log_end_offset", "Last LSN written to the log", value=b.state.next_lsn - 1)
        yield GaugeMetricFamily("txbroker_durable_offset", "Last LSN durable and published",
                                value=b.state.durable_lsn)
        waiting, through = b.state.key_index_lag()
        yield GaugeMetricFamily("txbroker_key_index_backlog_messages", "Messages of keyed records whose key-index "
                                "entries are still to be written (a read by key writes them first)", value=waiting)
        yield GaugeMetricFamily("txbroker_key_index_offset", "Last LSN whose records' keys are written", value=through)
        poll = b.idle_poll
        yield CounterMetricFamily("txbroker_idle_poll_seconds", "Time the event loop spent polling with nothing to "
                                  "do after its last read or write, before it slept (idle_poll_us)",
                                  value=poll.polled_seconds if poll is not None else 0.0)

    def _replication(self, b):
        if b.role.is_master:
            leader = b.leader
            lag = _gauge("txbroker_replication_lag_records", "Records a slave has not acknowledged", ["slave"])
            secs = _gauge("txbroker_replication_lag_seconds",
                          "How long ago the first record a slave has not acknowledged was written", ["slave"])
            in_sync = _gauge("txbroker_replication_slave_in_sync", "1 when the slave follows live", ["slave"])
            now = time.monotonic()
            end = b.state.next_lsn - 1
            n_sync = 0
            for feed in list(leader.feeds.values()):
                behind = max(0, end - feed.acked_lsn)
                lag.add_metric([feed.name], behind)
                secs.add_metric([feed.name], leader.lag_seconds(feed.acked_lsn, now) if behind else 0.0)
                counted = feed.live and leader.counts(feed.name)  # as a SYNC write counts it (the sync set)
                in_sync.add_metric([feed.name], 1.0 if counted else 0.0)
                n_sync += counted
            yield lag
            yield secs
            yield in_sync
            yield GaugeMetricFamily("txbroker_replication_slaves_in_sync", "Slaves following live (and, under a "
                                    "controller, in its sync set)", value=n_sync)
            required = b.config.sync_replicas if b.config.replication_mode == "SYNC" else 0
            yield GaugeMetricFamily("txbroker_replication_sync_replicas_required",
                                    "Slaves a SYNC write needs (0 under ASYNC replication)", value=required)
        else:
            f = b.follower
            yield GaugeMetricFamily("txbroker_replication_connected", "A slave: 1 when connected to its master",
                                    value=1.0 if f is not None and f.connected else 0.0)

    # ---- transactions -----------------------------------------------------------------------

    def _pending(self, b, dropped):
        now = time.time() * 1000
        oldest = None
        per_group: dict[str, list] = {}  # group -> [prepared, parked, oldest born_ms outside jobs]
        for p in b.state.pending_transactions():
            g = per_group.get(p.producer_group)
            if g is None:
                g = per_group[p.producer_group] = [0, 0, None]
            if p.state == PARKED:
                g[1] += 1
                continue
            g[0] += 1
            if not p.job_id:
                if g[2] is None or p.born_ms < g[2]:
                    g[2] = p.born_ms
                if oldest is None or p.born_ms < oldest:
                    oldest = p.born_ms
        yield GaugeMetricFamily("txbroker_pending_half_messages_oldest_age_seconds",
                                "Age of the oldest prepared, undecided transaction outside jobs (0: none)",
                                value=max(0.0, (now - oldest) / 1000) if oldest is not None else 0.0)
        groups = sorted(per_group.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
        if len(groups) > MAX_GROUPS:
            dropped["txbroker_group_pending_half_messages"] = len(groups) - MAX_GROUPS
            groups = groups[:MAX_GROUPS]
        count = _gauge("txbroker_group_pending_half_messages", "Transactions not finished, by producer group and "
                       "state (prepared, parked)", ["producer_group", "state"])
        age = _gauge("txbroker_group_oldest_pending_age_seconds", "Age of the group's oldest prepared transaction "
                     "outside jobs", ["producer_group"])
        window = _gauge("txbroker_group_check_window_seconds", "The group's transaction timeout plus one check "
                        "interval: a half message older than this was checked back and is still undecided",
                        ["producer_group"])
        for group, (prepared, parked, born) in groups:
            count.add_metric([group, "prepared"], prepared)
            count.add_metric([group, "parked"], parked)
            age.add_metric([group], max(0.0, (now - born) / 1000) if born is not None else 0.0)
            s = b.settings.for_group(group)
            window.add_metric([group], (s.timeout_ms + s.check_interval_ms) / 1000)
        yield count
        yield age
        yield window

    # ---- consumers ----------------------------------------------------------------------------

    def _consumers(self, b, dropped):
        state = b.state
        lags = []
        per_topic: dict[tuple[str, str], int] = {}
        committed: dict[str, int] = {}
        for group, topic, queue, offset in state.consumer_offsets():
            n = max(0, state.readable_end(topic, queue) - offset)
            lags.append((n, group, topic, queue))
            per_topic[(group, topic)] = per_topic.get((group, topic), 0) + n
            committed[group] = committed.get(group, 0) + offset
        lag = _gauge("txbroker_consumer_lag", "Messages published and not yet committed by the group, per queue",
                     ["consumer_group", "topic", "queue"])
        if len(lags) > MAX_QUEUE_SERIES:
            dropped["txbroker_consumer_lag"] = len(lags) - MAX_QUEUE_SERIES
            lags.sort(reverse=True)
            lags = lags[:MAX_QUEUE_SERIES]
        for n, group, topic, queue in lags:
            lag.add_metric([group, topic, str(queue)], n)
        yield lag
        by_group: dict[str, int] = {}
        for (group, _topic), n in per_topic.items():
            by_group[group] = by_group.get(group, 0) + n
        keep = sorted(committed, key=lambda g: -by_group.get(g, 0))
        if len(keep) > MAX_GROUPS:
            dropped["txbroker_consumer_group_lag"] = len(keep) - MAX_GROUPS
        kept = set(keep[:MAX_GROUPS])
        group_lag = _gauge("txbroker_consumer_group_lag", "Messages published and not yet committed by the group, "
                           "per topic", ["consumer_group", "topic"])
        for (group, topic), n in per_topic.items():
            if group in kept:
                group_lag.add_metric([group, topic], n)
        yield group_lag
        total = CounterMetricFamily("txbroker_consumer_group_committed_messages", "The group's committed offsets "
                                    "summed over its queues: the rate is how fast it consumes", labels=["consumer_group"])
        for group in kept:
            total.add_metric([group], committed[group])
        yield total
        dead = CounterMetricFamily("txbroker_dead_letters", "Messages stored in the consumer group's dead-letter "
                                   "topic (%DLQ%group)", labels=["consumer_group"])
        dlq = [(t, n) for t, n in list(state.topics.items()) if t.startswith(DLQ_PREFIX)]
        if len(dlq) > MAX_GROUPS:
            dropped["txbroker_dead_letters"] = len(dlq) - MAX_GROUPS
            dlq = dlq[:MAX_GROUPS]
        for topic, queues in dlq:
            dead.add_metric([topic[len(DLQ_PREFIX):]], sum(state.readable_end(topic, q) for q in range(queues)))
        # 0 for the groups without dead letters yet, so that increase() sees the first one: those with
        # committed offsets, and those retrying (a dead letter comes only after retries)
        with_dlq = {t[len(DLQ_PREFIX):] for t, _n in dlq}
        retrying = [t[len(RETRY_PREFIX):] for t in list(state.topics) if t.startswith(RETRY_PREFIX)]
        zero = [g for g in dict.fromkeys([*kept, *retrying])
                if g not in with_dlq and not g.startswith((RETRY_PREFIX, DLQ_PREFIX))]
        for group in zero[:max(0, MAX_GROUPS - len(dlq))]:
            dead.add_metric([group], 0)
        yield dead
