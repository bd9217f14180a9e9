"""A home releases its spanning decisions once every participant group has ended its part. A
decision stamped by a clock since set back (the master's wall clock ran 120 s ahead for a few
seconds) is asked about a check interval after it is first seen, not 120 s later: found by the
fault schedules (seed 401: a draining home stuck behind 24 decisions past settling)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from txbroker.broker.transaction import home
from txbroker.store.records import ReleaseRecord

NOW = 1_800_000_000_000
INTERVAL = 500


class State:
    def __init__(self, end_ms: int):
        self.durable_lsn = 100
        self.unreleased = {"t1": ["g0"]}
        self.f = SimpleNamespace(end_lsn=50, end_ms=end_ms, producer_group="pg")
        self.appended: list = []

    def unreleased_decisions(self):
        return self.unreleased

    def finished(self, txid):
        return self.f

    def append(self, record):
        self.appended.append(record)
        if isinstance(record, ReleaseRecord):
            for txid in record.transaction_ids:
                self.unreleased.pop(txid, None)


def releases(end_ms: int, monkeypatch) -> list[int]:
    """The passes (ms after NOW, every 250 ms for 2 s) at which the decision was released."""
    async def ended_there(cluster, group, producer_group, txids, why):
        return ["COMMITTED"] * len(txids)
    monkeypatch.setattr(home, "ask_group", ended_there)
    state = State(end_ms)
    route = SimpleNamespace(group=lambda name: object())
    settings = SimpleNamespace(for_group=lambda pg: SimpleNamespace(check_interval_ms=INTERVAL))
    h = home.HomeDecisions(state, SimpleNamespace(route=route), settings, SimpleNamespace(is_master=True))

    async def go():
        return [t for t in range(0, 2001, 250) if await h.release(now=NOW + t)]
    return asyncio.run(go())


def test_a_decision_is_released_a_check_interval_after_it_was_made(monkeypatch):
    assert releases(NOW, monkeypatch) == [500]


def test_a_decision_stamped_by_a_clock_running_ahead_is_released_as_soon(monkeypatch):
    assert releases(NOW + 120_000, monkeypatch) == [500]
