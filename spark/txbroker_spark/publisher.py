"""A task attempt's half messages: sent through a TransactionSession (the client library's, the
same requests as the transactional producers'), joining the write's job, pipelined, in batches, one
transaction id per batch.

Tasks do not register in the producer group (no HEARTBEAT): nobody answers check-backs, and nobody
needs to, since the broker ends a job's members from the job's decision (broker/transaction/jobs.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from operator import attrgetter

from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import BrokerError
from txbroker.client.transaction_session import Prepared, TransactionSession
from txbroker.protocol.bodies import Message
from txbroker.protocol.codes import ResponseCode

from txbroker_spark.options import OptionError, WriteOptions


def _refusal(e: BrokerError, o: WriteOptions, group: str = "") -> Exception:
    named = o.security.refusal(e)
    if named is not None:  # credentials, rights, TLS
        return named
    if e.code == ResponseCode.TOPIC_NOT_EXIST:
        return OptionError("topic", f"the broker refused: {e.remark} (create it, or enable auto_create_topic)")
    if e.code == ResponseCode.TRANSACTION_STATE_GROUP_WRONG:
        return OptionError("producerGroup", f"the broker refused: {e.remark}")
    where = f" on broker group {group}" if group and group != "default" else ""
    return RuntimeError(f"txbroker: the broker{where} refused a half message for topic {o.topic!r}: {e} (the task "
                        "fails; nothing of the write is published unless its job commits)")


# A transaction's messages in queue order (a stable sort: a key's rows, all on one queue, keep
# theirs; messages on different queues have no order between them). The broker indexes a committed
# transaction by runs of one queue (store/derived/messages.py `index`): keyed rows hashed over the
# queues made a run of about one message each, so ending a member wrote an entry per message.
_QUEUE = attrgetter("queue_id")
_BODY = attrgetter("body")


class TaskPublisher:
    """Sends one task's messages as half messages, `batch_size` rows (or `max_batch_bytes`) per
    transaction, with up to `max_inflight` prepares in flight while the task reads more rows."""

    def __init__(self, o: WriteOptions, txid_for, job_id: str, brokers: list[str], group_name: str = "",
                 properties: dict[str, str] | None = None):
        self.o = o
        self.job_id = job_id
        self.properties = properties or {}  # on every message, sent once per transaction
        self.group_name = group_name  # the broker group `brokers` are (named in refusals)
        self._txid_for = txid_for  # (chunk number, messages) -> transaction id
        self._loop = background.loop()
        self._client = BrokerClient(brokers, request_timeout=o.request_timeout, **o.security.client_kwargs())
        self._session = TransactionSession(self._client, o.group)
        self._inflight: deque = deque()
        self._pending: list[Message] = []
        self._pending_bytes = 0
        self.txids: list[str] = []
        self.rows = 0
        self.duplicates = 0
        self.chunks = 0

    def add(self, msgs: list[Message]) -> None:
        limit_rows, limit_bytes = self.o.batch_size, self.o.max_batch_bytes
        i, n = 0, len(msgs)
        while i < n:  # up to a transaction's room at a time: one sum, not a step per message
            chunk = msgs[i:i + limit_rows - len(self._pending)]
            i += len(chunk)
            size = sum(map(len, map(_BODY, chunk)))
            if self._pending_bytes + size > limit_bytes:
                self._add_each(chunk)  # it ends a transaction by bytes somewhere in the chunk
                continue
            self._pending += chunk
            self._pending_bytes += size
            if len(self._pending) >= limit_rows:
                self._flush()

    def _add_each(self, msgs: list[Message]) -> None:
        limit_rows, limit_bytes = self.o.batch_size, self.o.max_batch_bytes
        pending = self._pending
        for m in msgs:
            size = len(m.body)
            if pending and self._pending_bytes + size > limit_bytes:
                self._flush()
                pending = self._pending
            pending.append(m)
            self._pending_bytes += size
            if len(pending) >= limit_rows:
                self._flush()
                pending = self._pending

    def _flush(self) -> None:
        msgs = self._pending
        if not msgs:
            return
        self._pending, self._pending_bytes = [], 0
        msgs.sort(key=_QUEUE)
        txid = self._txid_for(self.chunks, msgs)
        self.chunks += 1
        self.txids.append(txid)
        self.rows += len(msgs)
        self._inflight.append(asyncio.run_coroutine_threadsafe(self._prepare(msgs, txid), self._loop))
        while len(self._inflight) >= self.o.max_inflight:
            self._reap(self._inflight.popleft())

    def _reap(self, fut) -> None:
        half: Prepared = fut.result()
        if half.duplicate:
            self.duplicates += 1

    async def _prepare(self, msgs: list[Message], txid: str) -> Prepared:
        try:
            return await self._session.prepare(msgs, txid, self.job_id, properties=self.properties)
        except BrokerError as e:
            raise _refusal(e, self.o, self.group_name) from None

    def finish(self) -> None:
        """Send what is left and wait until every half message is acknowledged."""
        self._flush()
        while self._inflight:
            self._reap(self._inflight.popleft())

    def abandon(self) -> None:
        """Stop waiting for prepares in flight (the task is failing)."""
        for fut in self._inflight:
            fut.cancel()
        self._inflight.clear()

    def close(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(10)
        except Exception:  # noqa: BLE001 - closing must not mask the task's own outcome
            pass
