"""Check-back over HTTP, for producer groups whose settings name a webhook URL (TxProducerGroup
checkMode `http`): for producers that keep no connection to the broker, such as short-lived jobs
whose outcome a service can look up.

The broker POSTs

    {"producer_group": G, "transaction_id": T, "commit_log_offset": N, "check_times": K,
     "message_count": M, "message": {"msg_id", "topic", "body" (base64), "tags", "keys",
                                     "properties", "born_timestamp"} (the first message)}

and expects 200 with {"state": "COMMIT" | "ROLLBACK" | "UNKNOWN"}. COMMIT and ROLLBACK end the
transaction exactly as a producer's check answer would (END_TRANSACTION from a check); UNKNOWN, an
error status, a malformed answer or a timeout leave it pending for the next check, which counts
toward check_max as any other check does. Requests are never awaited by the scan, and at most
MAX_IN_FLIGHT run at once.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import msgspec

from txbroker.broker.replies import RequestError
from txbroker.broker.transaction.service import TransactionService
from txbroker.protocol.bodies import EndTransactionRequest
from txbroker.protocol.codes import TransactionState

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 32
TIMEOUT_S = 5.0
_MESSAGE_FIELDS = ("msg_id", "topic", "body", "tags", "keys", "properties", "born_timestamp")
_STATES = {"COMMIT": TransactionState.COMMIT, "ROLLBACK": TransactionState.ROLLBACK,
           "UNKNOWN": TransactionState.UNKNOWN}


class WebhookChecker:
    def __init__(self, transactions: TransactionService):
        self._tx = transactions
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task] = set()

    def check(self, p, url: str, half) -> None:
        if half is None:
            return
        message, count = half
        doc = {"producer_group": p.producer_group, "transaction_id": p.transaction_id,
               "commit_log_offset": p.half_lsn, "check_times": p.checks, "message_count": count,
               "message": {f: msgspec.to_builtins(getattr(message, f)) for f in _MESSAGE_FIELDS}}
        task = asyncio.get_running_loop().create_task(self._ask(url, doc, p.producer_group, p.transaction_id,
                                                                p.half_lsn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ask(self, url: str, doc: dict, group: str, txid: str, half_lsn: int) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
            self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        async with self._slots:
            try:
                async with self._session.post(url, json=doc) as r:
                    if r.status != 200:
                        log.warning("check-back webhook %s answered HTTP %d for transaction %s", url, r.status, txid)
                        return
                    answer = await r.json(content_type=None)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                log.warning("check-back webhook %s failed for transaction %s: %s", url, txid, e or type(e).__name__)
                return
        state = _STATES.get(str(answer.get("state", "")).upper()) if isinstance(answer, dict) else None
        if state is None:
            log.warning("check-back webhook %s: answer for transaction %s must be {\"state\": "
                        "\"COMMIT\"|\"ROLLBACK\"|\"UNKNOWN\"}, got %.200r", url, txid, answer)
            return
        if state == TransactionState.UNKNOWN:
            return
        try:
            reply = self._tx.end(EndTransactionRequest(group, txid, int(state), half_lsn, True), "check")
        except RequestError as e:   # no longer master: the new master checks again
            log.info("webhook answer for transaction %s not applied: %s", txid, e.remark)
            return
        if reply.remark:
            log.info("webhook answer for transaction %s: %s", txid, reply.remark)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
