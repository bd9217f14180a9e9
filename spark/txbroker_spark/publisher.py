"""Talking to the broker from Spark tasks: building messages from rows, and sending a task's rows as
half messages joining the write's job (pipelined, in batches, one transaction id per batch).

Tasks do not register in the producer group (no HEARTBEAT): nobody answers check-backs, and nobody
needs to, since the broker ends a job's members from the job's decision (broker/transaction/jobs.py).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as _dt
import decimal
import hashlib
import logging
import uuid
from collections import deque

import msgspec

from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import BrokerError, ClientError, TlsHandshakeError
from txbroker.protocol.bodies import (
    JobInfo, Message, QueryJobRequest, RouteRequest, RouteResponse, SendRequest, SendResponse,
)
from txbroker.protocol.codes import RequestCode, ResponseCode

from txbroker_spark.options import OptionError, WriteOptions
from txbroker_spark.security import BrokerSecurity

log = logging.getLogger("txbroker_spark")


# ---- rows -> messages ------------------------------------------------------------------------

def _json_default(value):
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


# msgspec writes datetimes as RFC 3339, decimals as strings, bytes as base64, NaN/inf as null.
_dumps = msgspec.json.Encoder(enc_hook=_json_default, decimal_format="string").encode


class MessageBuilder:
    """Turns rows into Messages as the options say: body (row as JSON by default, or one column as
    bytes / string / JSON), keys from keyColumn, tags from tagsColumn or a constant."""

    def __init__(self, o: WriteOptions, properties: dict[str, str]):
        self.o = o
        self.topic = o.topic
        self.properties = properties

    def _body(self, value, row_number: int) -> bytes:
        fmt = self.o.body_format
        if fmt == "json":
            body = _dumps(value)
        elif value is None:
            raise ValueError(f"txbroker option 'bodyColumn': column {self.o.body_column!r} is null in a row "
                             f"(row {row_number} of this task); a message needs a body")
        elif fmt == "bytes":
            body = bytes(value)
        else:
            body = value.encode()
        if not body:
            raise ValueError(f"txbroker option 'bodyColumn': column {self.o.body_column!r} is empty in a row "
                             f"(row {row_number} of this task); the broker refuses empty bodies")
        return body

    def from_arrow(self, batch, first_row: int = 0) -> list[Message]:
        o = self.o
        n = batch.num_rows
        if o.body_column is None:
            values = batch.to_pylist()
        else:
            values = batch.column(o.body_column).to_pylist()
        keys = batch.column(o.key_column).to_pylist() if o.key_column else None
        tags = batch.column(o.tags_column).to_pylist() if o.tags_column else None
        return self._build(n, values, keys, tags, first_row)

    def from_rows(self, rows: list, first_row: int = 0) -> list[Message]:
        o = self.o
        if o.body_column is None:
            values = [r.asDict(recursive=True) for r in rows]
        else:
            values = [r[o.body_column] for r in rows]
        keys = [r[o.key_column] for r in rows] if o.key_column else None
        tags = [r[o.tags_column] for r in rows] if o.tags_column else None
        return self._build(len(rows), values, keys, tags, first_row)

    def _build(self, n, values, keys, tags, first_row) -> list[Message]:
        topic, props, const_tags, body = self.topic, self.properties, self.o.tags, self._body
        out = []
        for i in range(n):
            k = keys[i] if keys is not None else None
            t = tags[i] if tags is not None else const_tags
            out.append(Message(topic, body(values[i], first_row + i), "" if t is None else str(t),
                               "" if k is None else str(k), props))
        return out


def content_hash(msgs: list[Message]) -> str:
    """A digest of what a batch holds: two attempts that send the same rows get the same id."""
    h = hashlib.blake2b(digest_size=8)
    for m in msgs:
        for part in (m.body, m.keys.encode(), m.tags.encode()):
            h.update(len(part).to_bytes(4, "little"))
            h.update(part)
    return h.hexdigest()


# ---- the task side ---------------------------------------------------------------------------

def _refusal(e: BrokerError, o: WriteOptions) -> Exception:
    named = o.security.refusal(e)
    if named is not None:  # credentials, rights, TLS
        return named
    if e.code == ResponseCode.TOPIC_NOT_EXIST:
        return OptionError("topic", f"the broker refused: {e.remark} (create it, or enable auto_create_topic)")
    if e.code == ResponseCode.TRANSACTION_STATE_GROUP_WRONG:
        return OptionError("producerGroup", f"the broker refused: {e.remark}")
    return RuntimeError(f"txbroker: the broker refused a half message for topic {o.topic!r}: {e}")


class TaskPublisher:
    """Sends one task's messages as half messages, `batch_size` rows (or `max_batch_bytes`) per
    transaction, with up to `max_inflight` prepares in flight while the task reads more rows."""

    def __init__(self, o: WriteOptions, txid_for, job_id: str):
        self.o = o
        self.job_id = job_id
        self._txid_for = txid_for  # (chunk number, messages) -> transaction id
        self._loop = background.loop()
        self._client = BrokerClient(o.brokers, request_timeout=o.request_timeout, **o.security.client_kwargs())
        self._inflight: deque = deque()
        self._pending: list[Message] = []
        self._pending_bytes = 0
        self.txids: list[str] = []
        self.rows = 0
        self.duplicates = 0
        self.chunks = 0

    def add(self, msgs: list[Message]) -> None:
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
        txid = self._txid_for(self.chunks, msgs)
        self.chunks += 1
        self.txids.append(txid)
        self.rows += len(msgs)
        self._inflight.append(asyncio.run_coroutine_threadsafe(self._prepare(msgs, txid), self._loop))
        while len(self._inflight) >= self.o.max_inflight:
            self._reap(self._inflight.popleft())

    def _reap(self, fut) -> None:
        r: SendResponse = fut.result()
        if r.duplicate:
            self.duplicates += 1

    async def _prepare(self, msgs: list[Message], txid: str) -> SendResponse:
        try:
            return await self._client.request(RequestCode.SEND_MESSAGE, SendRequest(self.o.group, msgs, txid, self.job_id),
                                              SendResponse, retry=True)
        except BrokerError as e:
            raise _refusal(e, self.o) from None

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


async def _probe(brokers, topic: str, timeout: float, security: BrokerSecurity, group: str | None) -> int | None:
    client = BrokerClient(brokers, request_timeout=timeout, connect_timeout=min(timeout, 3.0),
                          **security.client_kwargs())
    try:
        if group is not None:
            # May these credentials act for the group? A query for a job name nobody uses is checked
            # against the group's right first, then answered QUERY_NOT_FOUND; it changes nothing.
            try:
                await client.request(RequestCode.QUERY_JOB, QueryJobRequest(
                    group, name=f"txbroker-spark-probe-{uuid.uuid4().hex}"), JobInfo, retry=False)
            except BrokerError as e:
                if security.refusal(e) is not None:  # no right to the group (or no credentials at all)
                    raise
        try:
            r: RouteResponse = await client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, RouteRequest(topic),
                                                    RouteResponse, retry=False)
        except BrokerError as e:
            if e.code == ResponseCode.TOPIC_NOT_EXIST:
                return None
            raise
        return r.queue_count
    finally:
        await client.close()


def probe_brokers(brokers: list[str], topic: str, timeout: float = 5.0, security: BrokerSecurity | None = None,
                  group: str | None = None) -> int | None:
    """Fail fast, naming option 'brokers' when no broker answers, or the credentials or TLS option
    the broker refused (also when they may not act for `group`, a writer's producer group); returns
    the topic's queue count (None if it does not exist yet)."""
    security = security or BrokerSecurity()
    try:
        return background.run(_probe(brokers, topic, timeout, security, group), timeout + 5)
    except (BrokerError, TlsHandshakeError) as e:
        named = security.refusal(e)
        if named is not None:
            raise named from None
        if not isinstance(e, BrokerError):
            raise
        raise OptionError("brokers", f"the broker at {e.broker} answered {e.code_name}: {e.remark}") from None
    except (ClientError, OSError, TimeoutError) as e:
        raise OptionError("brokers", f"no broker reachable at {','.join(brokers)}: {e}") from None
