"""What a broker group still holds for someone: the count that decides whether it may be removed
from a cluster (scale-down). Undelivered is, per queue, the messages past the lowest offset any
consumer group committed on the topic (all of them when no group consumes it: nobody has them
yet), delayed messages not yet due, retries and dead letters (someone may still want those); plus
every pending or parked transaction, since either may still become messages, every undecided
job whose home is here (its decision is still to be taken here, for every group it spans), and
every decided one some group it spans has not followed yet (it will ask here how the job ended,
even holding no member: released, broker/transaction/job_groups.py).
`waiting_on` counts, by the group that decides them, the participants held here and the jobs whose
members here still wait for their home's decision: the group they wait on may not leave before they
have asked it (whoever removes a group asks every other group's master). A home group keeps its
spanning decisions until its participants have ended (broker/transaction/home.py), and is not
drained before."""

from __future__ import annotations

from txbroker.broker.schedule_service import SCHEDULE_GROUP
from txbroker.protocol.admin import DrainStatus
from txbroker.protocol.names import (
    HALF_TOPIC, OP_HALF_TOPIC, PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC,
)

NOT_MESSAGES = frozenset({HALF_TOPIC, OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC})  # parked: counted as transactions
DELAYED_READ_LIMIT = 10_000  # delayed messages read to name their topics; past that, counted as "(delayed)"


def _delayed(broker, lowest: dict[tuple[str, int], int]) -> dict[str, int]:
    """Delayed messages not yet due (a consumer's retries among them), by the topic they are due in."""
    state, out, budget = broker.state, {}, DELAYED_READ_LIMIT
    for q in range(broker.topics.queue_count(SCHEDULE_TOPIC)):
        end = state.readable_end(SCHEDULE_TOPIC, q)
        offset = max(state.queue_start(SCHEDULE_TOPIC, q), lowest.get((SCHEDULE_TOPIC, q), 0))
        while offset < end:
            if budget <= 0:
                out["(delayed)"] = out.get("(delayed)", 0) + end - offset
                break
            msgs, nxt, _ = broker.reader.read_queue(SCHEDULE_TOPIC, q, offset, min(budget, 1024))
            if nxt <= offset:  # nothing readable from here to what is published
                break
            offset = nxt
            budget -= len(msgs)
            for m in msgs:
                topic = m.properties.get(PROPERTY_REAL_TOPIC, "(delayed)")
                out[topic] = out.get(topic, 0) + 1
    return out


def drain_status(broker) -> DrainStatus:
    state = broker.state
    lowest: dict[tuple[str, int], int] = {}
    for group, topic, queue, offset in state.consumer_offsets():
        if (topic == SCHEDULE_TOPIC) != (group == SCHEDULE_GROUP):
            continue
        key = (topic, queue)
        lowest[key] = min(offset, lowest.get(key, offset))
    topics: dict[str, int] = {}
    for topic, count in state.topics.items():
        if topic in NOT_MESSAGES:
            continue
        n = 0
        for q in range(count):
            end = state.readable_end(topic, q)
            start = max(state.queue_start(topic, q), lowest.get((topic, q), 0))
            n += max(end - start, 0)
        if n:
            topics[topic] = n
    for topic, n in _delayed(broker, lowest).items():  # (delayed messages are in no topic until due)
        topics[topic] = topics.get(topic, 0) + n
    undelivered = sum(topics.values())
    pending = state.pending_count
    waiting_on: dict[str, int] = {}
    for p in state.pending_transactions():
        if p.home and p.state != "PARKED":  # a parked one no longer asks: an operator decides it
            waiting_on[p.home] = waiting_on.get(p.home, 0) + 1
    undecided_jobs = 0
    unreleased_jobs = len(state.unreleased_jobs())
    for j in list(state.jobs.values()):
        if j.decided:
            continue
        if not j.home:
            undecided_jobs += 1
        elif any((p := state.pending_transaction(t)) is not None and p.state != "PARKED"
                 for t in state.job_members.get(j.job_id, ())):
            waiting_on[j.home] = waiting_on.get(j.home, 0) + 1
    # (a participant's own master may report it ended before any slave holds that: only the home's
    # release, on the participants' answers as published, says none can ask any more; seed 366)
    unreleased_decisions = len(state.unreleased_decisions())
    drained = (undelivered == 0 and pending == 0 and undecided_jobs == 0 and unreleased_jobs == 0
               and unreleased_decisions == 0)
    return DrainStatus(broker.cluster.group, broker.cluster.draining, undelivered, topics, pending, drained,
                       waiting_on, undecided_jobs, unreleased_jobs, unreleased_decisions)
