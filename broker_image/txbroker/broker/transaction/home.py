"""The home's side of transactions that span broker groups (the participants' side is participants.py).

The home's half message names the groups of its participants (HalfRecord.participants). Once
decided, the home must keep the decision while any participant may still ask how the transaction
ended, also after retention deleted the records it came from (store/derived/transactions.py keeps
it). So the home's master asks each participant group, in one request per group every tick, whether
its participant has ended; when every one has (or its group has left the route), it records a
ReleaseRecord, and the decision expires with the log from then on.

Both sides ask with QUERY_TRANSACTION_STATES, answered by a group's master as published (an end no
slave holds yet still reads PREPARED), and only for transactions of the producer group asked for.
"""

from __future__ import annotations

import asyncio
import logging

from txbroker.broker.cluster import ClusterMembership
from txbroker.broker.role import RoleState
from txbroker.broker.transaction.service import now_ms
from txbroker.broker.transaction.settings import SettingsBook
from txbroker.client.errors import ClientError
from txbroker.client.log_limit import RepeatedWarnings
from txbroker.lifecycle import stop_task
from txbroker.protocol.bodies import TransactionStatesRequest, TransactionStatesResponse
from txbroker.protocol.codes import RequestCode
from txbroker.store.records import PARKED, PREPARED, ReleaseRecord
from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)
_warnings = RepeatedWarnings(log)

UNKNOWN = "UNKNOWN"
ASK_BATCH = 5000  # transaction ids per QUERY_TRANSACTION_STATES
STILL_PENDING = frozenset({PREPARED, PARKED})


def states_as_published(state: StateMachine, producer_group: str, txids: list[str]) -> list[str]:
    """How each transaction stands here, as readers see it (an end no slave holds yet still reads
    PREPARED); UNKNOWN for one this broker does not know, or that is not `producer_group`'s."""
    out = []
    for txid in txids:
        p = state.pending_transaction(txid)
        if p is not None:
            out.append(p.state if p.producer_group == producer_group else UNKNOWN)
            continue
        f = state.finished(txid)
        if f is None or f.producer_group != producer_group:
            out.append(UNKNOWN)
        else:
            out.append(f.state if f.end_lsn <= state.durable_lsn else PREPARED)
    return out


async def ask_group(cluster: ClusterMembership, group: str, producer_group: str, txids: list[str],
                    why: str) -> list[str] | None:
    """Another group's master's answer for these transactions of `producer_group`, or None if it
    could not be asked (said once in a while, not once a transaction)."""
    client = cluster.peer(group)
    if client is None:
        _warnings.warning(f"{why}: not in route", "%s: group %s is not in cluster route version %d", why, group,
                          cluster.route.version if cluster.route else 0)
        return None
    try:
        r: TransactionStatesResponse = await client.request(
            RequestCode.QUERY_TRANSACTION_STATES, TransactionStatesRequest(producer_group, txids),
            TransactionStatesResponse)
    except ClientError as e:
        _warnings.warning(f"{why}: unreachable", "%s: could not ask group %s about %d transactions: %s", why, group,
                          len(txids), e)
        return None
    return r.states


class HomeDecisions:
    def __init__(self, state: StateMachine, cluster: ClusterMembership, settings: SettingsBook, role: RoleState):
        self._state = state
        self._cluster = cluster
        self._settings = settings
        self._role = role
        self._ended: dict[str, set[str]] = {}  # txid -> participant groups that said theirs has ended
        self._asked: dict[str, int] = {}  # txid -> when its participants were last asked (ms)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None and self._cluster.route is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="home decisions")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        self._ended.clear()
        self._asked.clear()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._settings.tick_seconds())
            try:
                await self.release()
            except Exception:  # a failed pass must not end releasing for good
                log.exception("releasing spanning decisions failed; retrying at the next tick")

    async def release(self, now: int | None = None) -> int:
        """Ask the participant groups of this home's published decisions whether theirs have ended;
        record a release for those all of whose participants have. Returns how many were released."""
        if not self._role.is_master:
            return 0
        state, route = self._state, self._cluster.route
        now = now_ms() if now is None else now
        durable = state.durable_lsn
        due: dict[tuple[str, str], list[str]] = {}
        for txid, groups in list(state.unreleased_decisions().items()):
            f = state.finished(txid)
            if f is None or f.end_lsn > durable:
                continue  # not decided as far as anyone may know yet
            # first a check interval after the decision: the producer tells its participants at once.
            # A stamp ahead of this clock (set since by a clock running ahead) counts from when first
            # seen here, not the stamp: else it waits out the skew (the fault schedules, seed 401)
            stamp = f.end_ms if f.end_ms <= now else self._asked.setdefault(txid, now)
            if now - max(self._asked.get(txid, 0), stamp) < self._settings.for_group(f.producer_group).check_interval_ms:
                continue
            self._asked[txid] = now
            ended = self._ended.setdefault(txid, set())
            for group in groups:
                if group in ended:
                    continue
                if route is None or route.group(group) is None:  # the group left (drained): none waits there
                    ended.add(group)
                else:
                    due.setdefault((group, f.producer_group), []).append(txid)
        for (group, producer_group), txids in due.items():
            for i in range(0, len(txids), ASK_BATCH):
                batch = txids[i:i + ASK_BATCH]
                states = await ask_group(self._cluster, group, producer_group, batch, "releasing decisions")
                if states is None:
                    break
                for txid, s in zip(batch, states):
                    if s not in STILL_PENDING:  # ended there (or never stored, or expired there after it ended)
                        self._ended.setdefault(txid, set()).add(group)
        unreleased = state.unreleased_decisions()
        done = [txid for txid, ended in self._ended.items()
                if txid in unreleased and ended >= set(unreleased[txid])]
        for txid in [t for t in self._ended if t not in unreleased]:
            self._ended.pop(txid, None)
            self._asked.pop(txid, None)
        if done and self._role.is_master:
            state.append(ReleaseRecord(done, now))
            for txid in done:
                self._ended.pop(txid, None)
                self._asked.pop(txid, None)
        return len(done)


__all__ = ["HomeDecisions", "UNKNOWN", "ask_group", "states_as_published"]
