"""PULL_MESSAGE: committed messages of one queue from an offset, long-polling when it is empty."""

import asyncio

from txbroker.broker.auth.acl import SUB
from txbroker.broker.replies import Reply, RequestError, error, ok
from txbroker.protocol.bodies import PullRequest, PullResponse, decoder
from txbroker.protocol.codes import ResponseCode
from txbroker.protocol.tags import TagExpressionError, parse_tags
from txbroker.store import keys

MAX_PULL = 1024
MAX_WAIT_MS = 60_000


class PullProcessor:
    def __init__(self, broker):
        self._decode = decoder(PullRequest).decode
        self._topics = broker.topics
        self._reader = broker.reader
        self._state = broker.state
        self._role = broker.role
        self._slave_reads = broker.config.slave_read_enable
        self._expressions: dict[str, frozenset | None] = {}

    async def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_topic(req.topic, SUB)
        if req.consumer_group:
            conn.access.require_consumer_group(req.consumer_group)
        if not self._slave_reads:
            self._role.require_master()
        else:
            self._role.require_current()
        self._topics.require(req.topic, req.queue_id)
        if req.offset < 0:
            return error(ResponseCode.PULL_OFFSET_MOVED, f"offset {req.offset} is negative")
        start = self._state.queue_start(req.topic, req.queue_id)
        if req.offset < start:
            return error(ResponseCode.PULL_OFFSET_MOVED,
                         f"offset {req.offset} is before the start of queue {req.topic}:{req.queue_id} ({start}): "
                         f"older messages were deleted by retention")
        wanted = self._tags(req.tags) if req.tags else None
        n = min(max(req.max_messages, 1), MAX_PULL)
        msgs, nxt, end = self._reader.read_queue(req.topic, req.queue_id, req.offset, n)
        if req.offset > end and req.offset > self._state.queue_end(req.topic, req.queue_id):
            # (beyond what is readable but not beyond what is stored: unpublished records, wait for them)
            return error(ResponseCode.PULL_OFFSET_MOVED,
                         f"offset {req.offset} is beyond the end of queue {req.topic}:{req.queue_id} ({end})")
        if not msgs and nxt == req.offset and req.max_wait_ms > 0:  # (passed over a gap: answer at once)
            prefix = keys.queue_prefix(req.topic, req.queue_id)
            waiter = self._state.wait_visible(prefix)
            try:
                await asyncio.wait_for(waiter, min(req.max_wait_ms, MAX_WAIT_MS) / 1000)
            except asyncio.TimeoutError:
                self._state.forget_waiter(prefix, waiter)
            msgs, nxt, end = self._reader.read_queue(req.topic, req.queue_id, req.offset, n)
        if wanted is not None:  # filtered out messages are passed over: next_offset still moves on
            msgs = [m for m in msgs if m.tags in wanted]
        return ok(PullResponse(msgs, nxt, 0, end))

    def _tags(self, expression: str):
        try:
            return self._expressions[expression]
        except KeyError:
            pass
        try:
            parsed = parse_tags(expression)
        except TagExpressionError as e:
            raise RequestError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(e)) from None
        if len(self._expressions) < 10_000:
            self._expressions[expression] = parsed
        return parsed
