"""Participants: the half messages of a transaction that spans broker groups, held by the groups
that do not decide it.

Such a transaction has one half message per group it writes to, all under one transaction id. The
group of the first is its home: there it is an ordinary transaction, ended by the producer's
END_TRANSACTION or by check-back. Every other group holds a participant (HalfRecord.home), which is
never checked back and never trusts a producer's word for its outcome: it ends as the home's half
message ended, asked broker to broker (QUERY_TRANSACTION_STATES, answered by the home's master as
published, so no failover of the home can take back what a participant followed):
- a producer's END_TRANSACTION for a participant (sent after the home's) makes it ask the home at once;
- every tick, participants older than their group's transaction timeout and not asked about within
  its check interval are asked about, in one request per home group (the producer may be gone).
A participant of a parked home transaction waits with it; it is not parked itself, so whatever ends
the home's (an operator's resume, commit or rollback) ends it too. A participant whose home does
not know its transaction (UNKNOWN: its half message lost in an ASYNC failover) will never hear an
outcome: after a few such answers it is parked, for an operator (as a transaction past its checks).
"""

from __future__ import annotations

import asyncio
import logging

from txbroker.broker.cluster import ClusterMembership
from txbroker.broker.replies import Reply, error, ok
from txbroker.broker.role import RoleState
from txbroker.broker.transaction.service import TransactionService, now_ms
from txbroker.broker.transaction.settings import SettingsBook
from txbroker.broker.transaction.home import ASK_BATCH, UNKNOWN, ask_group
from txbroker.lifecycle import stop_task
from txbroker.protocol.bodies import EndTransactionRequest, EndTransactionResponse
from txbroker.protocol.codes import ResponseCode, TransactionState
from txbroker.store.records import COMMITTED, PREPARED, ROLLED_BACK, CheckRecord, PendingTx
from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)

UNKNOWN_AT_HOME_LIMIT = 3  # answers "UNKNOWN" from the home before a participant is parked
_ENDED = {COMMITTED: TransactionState.COMMIT, ROLLED_BACK: TransactionState.ROLLBACK}


class Participants:
    def __init__(self, state: StateMachine, transactions: TransactionService, cluster: ClusterMembership,
                 settings: SettingsBook, role: RoleState):
        self._state = state
        self._tx = transactions
        self._cluster = cluster
        self._settings = settings
        self._role = role
        self._stamped_ahead: dict[str, int] = {}  # txid -> when a sweep saw it stamped ahead of the clock
        self._asked: dict[str, int] = {}  # txid -> when last asked about (ms); memory only, as it may be
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None and self._cluster.route is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="participants")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        self._asked.clear()
        self._stamped_ahead.clear()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._settings.tick_seconds())
            try:
                await self.sweep()
            except Exception:  # a failed pass must not end the asking for good
                log.exception("participants pass failed; retrying at the next tick")

    # ---- asking the home ----------------------------------------------------------------------

    async def ask(self, home: str, group: str, txids: list[str]) -> list[str] | None:
        """The home group's answer for these ids, or None if its master could not be asked."""
        return await ask_group(self._cluster, home, group, txids, f"participants of producer group {group}")

    async def sweep(self, now: int | None = None) -> int:
        """Ask every home about its due participants; end those it decided. Returns how many ended."""
        if not self._role.is_master:
            return 0
        now = now_ms() if now is None else now
        due: dict[tuple[str, str], list[str]] = {}
        asked, ahead = self._asked, self._stamped_ahead
        for txid in [t for t, at in asked.items() if at > now]:  # asked under a clock since set back
            del asked[txid]
        for p in self._state.pending_transactions():
            if not p.home or p.state != PREPARED:
                continue  # not a participant, or parked: an operator decides it now
            s = self._settings.for_group(p.producer_group)
            born = p.born_ms
            if born > now:  # stamped by a clock since set back: its age counts from when a sweep saw that,
                born = ahead.setdefault(p.transaction_id, now)  # as check-back's (fault harness, seed 10)
            if now - born < (p.immunity_ms or s.timeout_ms):
                continue
            if now - asked.get(p.transaction_id, 0) < s.check_interval_ms:
                continue
            due.setdefault((p.home, p.producer_group), []).append(p.transaction_id)
        ended = 0
        for (home, group), txids in due.items():
            for i in range(0, len(txids), ASK_BATCH):
                batch = txids[i:i + ASK_BATCH]
                for txid in batch:
                    asked[txid] = now
                states = await self.ask(home, group, batch)
                if states is None:
                    break
                ended += self._follow(batch, states, "home")
        for txid in [t for t in asked if self._state.pending_transaction(t) is None]:
            del asked[txid]
        for txid in [t for t in ahead if self._state.pending_transaction(t) is None]:
            del ahead[txid]
        return ended

    def _follow(self, txids: list[str], states: list[str], by: str) -> int:
        ended = 0
        unknown = []
        for txid, home_state in zip(txids, states):
            p = self._state.pending_transaction(txid)
            if p is None or not self._role.is_master:
                continue
            outcome = _ENDED.get(home_state)
            if outcome is not None:
                self._tx.finish(p, outcome, by)
                ended += 1
            elif home_state == UNKNOWN and p.state == PREPARED:
                unknown.append(p)
        if unknown:
            self._unknown_at_home(unknown)
        return ended

    def _unknown_at_home(self, unknown: list) -> None:
        """The home does not know these (its half message lost in an ASYNC failover, or its decision
        expired): no answer will ever come. Each such answer counts as a check; after
        UNKNOWN_AT_HOME_LIMIT of them the participant is parked, for an operator to decide and for
        `tx list --state parked`, the console and the parked-transactions alert to show."""
        now = now_ms()
        self._state.append(CheckRecord([p.transaction_id for p in unknown], now))
        parked = [p for p in unknown if p.checks >= UNKNOWN_AT_HOME_LIMIT]
        for p in parked:
            self._tx.park(p, now)
        if parked:
            homes = sorted({p.home for p in parked})
            log.warning("%d participants parked: their home group(s) %s do not know their transactions (lost in "
                        "a failover, or forgotten); an operator decides them (`txbroker tx list --state parked`): "
                        "%s%s", len(parked), ", ".join(homes), ", ".join(p.transaction_id for p in parked[:5]),
                        ", ..." if len(parked) > 5 else "")

    # ---- a producer's END_TRANSACTION for a participant -------------------------------------------

    async def end(self, p: PendingTx, wanted: TransactionState) -> Reply:
        """The producer's decision for a participant: taken only as the home's transaction ended."""
        states = await self.ask(p.home, p.producer_group, [p.transaction_id])
        if states is None:
            return error(ResponseCode.SERVICE_NOT_AVAILABLE,
                         f"transaction {p.transaction_id} is decided by group {p.home}, which could not be asked; "
                         "this broker asks again by itself")
        outcome = _ENDED.get(states[0])
        if outcome is None:
            return error(ResponseCode.ILLEGAL_OPERATION,
                         f"transaction {p.transaction_id} is decided by group {p.home}, where it is "
                         f"{states[0]}: end it there first")
        current = self._state.pending_transaction(p.transaction_id)
        if current is None:  # ended meanwhile (a sweep), as the home said: answered as any repeated END
            return self._tx.end(EndTransactionRequest(p.producer_group, p.transaction_id, int(wanted)))
        if outcome != wanted:
            code = (ResponseCode.TRANSACTION_SHOULD_COMMIT if outcome == TransactionState.COMMIT
                    else ResponseCode.TRANSACTION_SHOULD_ROLLBACK)
            return error(code, f"transaction {p.transaction_id}: its home group {p.home} "
                               f"{'committed' if outcome == TransactionState.COMMIT else 'rolled back'} it")
        self._role.require_master()
        offsets, durable = self._tx.finish(current, outcome, "home")
        return ok(EndTransactionResponse(outcome, False, offsets), durable)


__all__ = ["Participants", "UNKNOWN_AT_HOME_LIMIT"]
