"""The failover rule without a slave in sync (failover.most_caught_up), checked on a model of SYNC
replication over many random histories: writes acknowledged once `k` followers hold them, followers
lagging or cut off, masters crashing with tails nobody acknowledged, new masters writing their epoch
record first, followers truncating to what they share with the master they follow. Whenever every
broker but the lost master answers, the one most_caught_up names holds every acknowledged write.
Ordered by log length alone (what take_over did before 259723e) it does not: the model finds a
history where that loses acknowledged writes, so the check has teeth."""

from __future__ import annotations

import random

from txbroker_operator import failover
from txbroker_operator.brokers import BrokerInfo
from txbroker_operator.observe import Member

EPOCH = "epoch"


def _member(name: str, index: int, log: list) -> Member:
    epoch = max((e for e, _w in log), default=0)
    info = BrokerInfo(role="slave", epoch=epoch, log_end_offset=len(log), master="m", fenced_by=0, pending=0,
                      parked=0, slaves=(), connected=True)
    return Member(name, index, {"metadata": {"name": name}, "status": {}}, info)


def _shared(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _history(rnd: random.Random, n: int, k: int, pick) -> bool:
    """One random history of a group of n brokers; False when a failover by `pick` lost an
    acknowledged write."""
    logs = {f"b{i}": [(1, EPOCH)] for i in range(n)}
    master, epoch, wid = "b0", 1, 0
    following = set(logs) - {master}   # followers of the master now (the others wait to rejoin)
    acked: set[int] = set()
    for _step in range(rnd.randint(5, 40)):
        r = rnd.random()
        if r < 0.6:   # a write; followers take some of the master's log (a prefix), maybe not this one
            wid += 1
            logs[master].append((epoch, wid))
            for f in following:
                if rnd.random() < 0.7:
                    logs[f] = logs[master][:rnd.randint(len(logs[f]), len(logs[master]))]
            if sum(1 for f in following if (epoch, wid) in logs[f]) >= k:
                acked.add(wid)
        elif r < 0.7 and following:   # a follower cut off (it lags from now on, until it rejoins)
            following.discard(rnd.choice(sorted(following)))
        elif r < 0.8:   # one that was cut off rejoins: truncates to what it shares, then follows
            out = sorted(set(logs) - following - {master})
            if out:
                f = rnd.choice(out)
                logs[f] = logs[f][:_shared(logs[f], logs[master])]
                following.add(f)
        else:   # the master is lost; every other broker answers
            others = [_member(b, int(b[1:]), logs[b]) for b in sorted(logs) if b != master]
            chosen = pick(others)
            held = {w for _e, w in logs[chosen.name]}
            if not acked <= held:
                return False
            epoch = max(max(e for e, _w in log) for log in logs.values()) + 1
            master = chosen.name
            logs[master].append((epoch, EPOCH))   # the epoch record comes first
            following = set()
            for b in logs:   # the others follow it; each truncates to what it shares (the old master's tail goes)
                if b != master and rnd.random() < 0.7:
                    logs[b] = logs[b][:_shared(logs[b], logs[master])]
                    following.add(b)
    return True


def test_the_furthest_at_the_newest_epoch_holds_every_acknowledged_write():
    rnd = random.Random(274)
    for _ in range(3000):
        n, k = rnd.choice([(2, 1), (3, 1), (3, 2), (4, 1), (5, 2)])
        assert _history(rnd, n, k, lambda brokers: failover.most_caught_up(brokers, None))


def test_the_longest_log_alone_loses_acknowledged_writes_in_some_history():
    rnd = random.Random(274)
    longest = lambda brokers: max(brokers, key=lambda m: (m.info.log_end_offset, -m.index))  # noqa: E731
    assert not all(_history(rnd, *rnd.choice([(2, 1), (3, 1), (3, 2), (4, 1)]), longest) for _ in range(3000))
