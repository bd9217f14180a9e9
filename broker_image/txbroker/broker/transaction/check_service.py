"""Check-back: ask producers about transactions left undecided.

Each scan walks only the pending transactions (kept in memory, recovered from the pending column
family), never the finished history. A transaction is due when it is older than its immunity time
(CHECK_IMMUNITY_TIME_IN_SECONDS) or the group's timeout, and its last check is at least one check
interval ago (immunity: the message's own, else the group's default, else the timeout). Waiting out
immunity burns no check (RocketMQ issue 8311). A due transaction that has
had `check_max` checks is parked in TRANS_CHECK_MAX_TIME_TOPIC; otherwise one live producer of its
group is asked, round robin, with a one-way frame that is never awaited, so a slow producer cannot
hold the scan. A check counts even when no producer is connected: that is what guarantees every
transaction is eventually decided or parked (invariant I4). A group with a webhook URL is asked
over HTTP instead (webhook_check.py). Members of a coordinated transaction are never checked back:
their job's decision (or its deadline) ends them (jobs.py); nor are the participants of a transaction
that spans broker groups: they end as their home group's transaction ended (participants.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from txbroker.broker.metrics import BrokerMetrics
from txbroker.broker.producers import ProducerRegistry
from txbroker.broker.transaction.settings import SettingsBook
from txbroker.broker.transaction.service import TransactionService, now_ms
from txbroker.broker.transaction.webhook_check import WebhookChecker
from txbroker.lifecycle import stop_task
from txbroker.protocol.bodies import CheckTransactionStateRequest
from txbroker.protocol.codes import RequestCode
from txbroker.store.reads import MessageReader
from txbroker.store.records import PREPARED, CheckRecord
from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)


@dataclass
class ScanResult:
    pending: int = 0
    checked: int = 0
    parked: int = 0
    without_producer: int = 0
    seconds: float = 0.0


class CheckService:
    def __init__(self, state: StateMachine, reader: MessageReader, transactions: TransactionService,
                 settings: SettingsBook, producers: ProducerRegistry, metrics: BrokerMetrics):
        self._state = state
        self._reader = reader
        self._tx = transactions
        self._settings = settings
        self._producers = producers
        self._metrics = metrics
        self._webhook = WebhookChecker(transactions)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._running = False
        self.last_scan: ScanResult | None = None
        self._stamped_ahead: dict[str, int] = {}  # txid -> when a scan saw its time stamps ahead of the clock
        settings.on_change(self._wake.set)

    def start(self) -> None:
        """Runs on the master only; a promoted slave starts it from the pending transactions it holds."""
        if self._task is None:
            self._running = True
            self._task = asyncio.get_running_loop().create_task(self._run(), name="check-back")

    async def stop(self) -> None:
        self._running = False
        self._wake.set()
        await stop_task(self._task)
        self._task = None
        await self._webhook.close()

    async def _run(self) -> None:
        while self._running:
            try:
                await asyncio.wait_for(self._wake.wait(), self._settings.tick_seconds())
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            if not self._running:
                return
            try:
                self.scan()
            except Exception:  # a scan failing must not end check-back for good
                log.exception("check-back scan failed; retrying at the next interval")

    def scan(self, now: int | None = None) -> ScanResult:
        t0 = time.perf_counter()
        now = now_ms() if now is None else now
        result = ScanResult(pending=self._state.pending_count)
        settings_for = self._settings.for_group
        due: list = []
        to_park: list = []
        ahead = self._stamped_ahead
        for p in self._state.pending_transactions():
            if p.state != PREPARED or p.job_id or p.home:
                continue  # a job's member, its job decides it (jobs.py); a participant, its home (participants.py)
            s = settings_for(p.producer_group)
            born, last = p.born_ms, p.last_check_ms
            if born > now or last > now:
                # Stamped by a clock ahead of this one (it was set back, or another master's ran fast):
                # its age counts from when a scan first saw that, not from the skew's end (seeds 422
                # and 456 of the fault harness: 120 s without a check after a clock went back).
                seen = ahead.setdefault(p.transaction_id, now)
                born, last = (seen if born > now else born), (seen if last > now else last)
            if now - born < (p.immunity_ms or s.default_immunity_ms or s.timeout_ms):
                continue  # still immune: no check, and no check counted
            if last and now - last < s.check_interval_ms:
                continue
            if p.checks >= s.check_max:
                to_park.append(p)
            else:
                due.append(p)
        if ahead:
            for txid in [t for t in ahead if self._state.pending_transaction(t) is None]:
                del ahead[txid]
        for p in to_park:
            self._tx.park(p, now)
        if to_park:  # one line a scan, not one a transaction (a group whose producers are gone parks many)
            by_group: dict[str, list[str]] = {}
            for p in to_park:
                by_group.setdefault(p.producer_group, []).append(p.transaction_id)
            for group, ids in by_group.items():
                log.warning("%d transactions of group %s parked in TRANS_CHECK_MAX_TIME_TOPIC after their %d "
                            "checks (%s%s); `txbroker tx list --state parked` lists them", len(ids), group,
                            settings_for(group).check_max, ", ".join(ids[:5]), ", ..." if len(ids) > 5 else "")
        result.parked = len(to_park)
        if due:
            self._state.append(CheckRecord([p.transaction_id for p in due], now))
            live_by_group: dict[str, list] = {}
            for p in due:
                webhook = settings_for(p.producer_group).webhook_url
                if webhook:
                    self._webhook.check(p, webhook, self._reader.half_message(p.half_lsn))
                    result.checked += 1
                    continue
                live = live_by_group.get(p.producer_group)
                if live is None:
                    live = live_by_group[p.producer_group] = self._producers.live(p.producer_group)
                conn = self._producers.pick(p.producer_group, live) if live else None
                if conn is None:
                    result.without_producer += 1
                    continue
                self._send_check(conn, p)
                result.checked += 1
        if result.without_producer:
            self._metrics.checkbacks_unanswerable.inc(result.without_producer)
            log.info("check-back: %d due transactions have no live producer in their group (counted anyway)",
                     result.without_producer)
        self._metrics.checkbacks.inc(result.checked)
        result.seconds = time.perf_counter() - t0
        self._metrics.check_scan_seconds.observe(result.seconds)
        self.last_scan = result
        return result

    def _send_check(self, conn, p) -> None:
        got = self._reader.half_message(p.half_lsn)
        if got is None:  # pragma: no cover - a pending transaction always has its half record
            log.error("transaction %s: half message at %d is missing", p.transaction_id, p.half_lsn)
            return
        message, count = got
        conn.send_oneway(RequestCode.CHECK_TRANSACTION_STATE, CheckTransactionStateRequest(
            producer_group=p.producer_group, transaction_id=p.transaction_id, commit_log_offset=p.half_lsn,
            message=message, check_times=p.checks, message_count=count))
