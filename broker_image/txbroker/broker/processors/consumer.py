"""Consumer-group requests: membership, offsets, send-back (retry / DLQ), queue locks, and lookups
by timestamp and key."""

from __future__ import annotations

from txbroker.broker.auth.acl import SUB
from txbroker.broker.replies import Reply, error, ok
from txbroker.broker.schedule_service import ScheduleService
from txbroker.protocol.bodies import (
    CommitOffsetsRequest, ConsumerListRequest, ConsumerListResponse, LockQueuesRequest, LockQueuesResponse, Message,
    QueryByKeyRequest, QueryByKeyResponse, QueryOffsetsRequest, QueryOffsetsResponse, SearchOffsetRequest,
    SearchOffsetResponse, SendBackRequest, SendBackResponse, decoder,
)
from txbroker.protocol.codes import ResponseCode
from txbroker.protocol.names import (
    PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_PRODUCER_GROUP, PROPERTY_RECONSUME_TIME, PROPERTY_RETRY_TOPIC,
    PROPERTY_TRANSACTION_PREPARED, RETRY_PREFIX, dlq_topic, retry_topic,
)
from txbroker.store import keys
from txbroker.store.records import OffsetRecord
from txbroker.broker.transaction.service import now_ms

FIRST_RETRY_LEVEL = 3  # RocketMQ: the first retry waits level 3 (10 s by default)


class ConsumerListProcessor:
    def __init__(self, broker):
        self._decode = decoder(ConsumerListRequest).decode
        self._consumers = broker.consumers

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_consumer_group(req.consumer_group)
        return ok(ConsumerListResponse(self._consumers.members(req.consumer_group)))


class CommitOffsetsProcessor:
    def __init__(self, broker):
        self._decode = decoder(CommitOffsetsRequest).decode
        self._b = broker

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_consumer_group(req.consumer_group)
        self._b.role.require_master()
        if not req.consumer_group:
            return error(ResponseCode.MESSAGE_ILLEGAL, "committing offsets needs a consumer group")
        state = self._b.state
        entries = []
        kept_at = 0  # the newest record holding an offset that stands instead of the one asked for
        for o in req.offsets:
            self._b.topics.require(o.topic, o.queue_id)
            end = state.queue_end(o.topic, o.queue_id)
            if not 0 <= o.offset <= end:
                return error(ResponseCode.PULL_OFFSET_MOVED,
                             f"offset {o.offset} is outside queue {o.topic}:{o.queue_id} (0..{end})")
            if req.only_forward:
                current = state.committed_offset(req.consumer_group, o.topic, o.queue_id, published=False)
                if current is not None and o.offset <= current:
                    # another member got further, or this is a retry of a commit already written:
                    # acknowledged once that write is published, as the first try would have been
                    kept_at = max(kept_at, state.offset_written_at(req.consumer_group, o.topic, o.queue_id))
                    continue
            entries.append((o.topic, o.queue_id, o.offset))
        if not entries:
            return ok(None, state.published_future(kept_at) if kept_at else None)
        _lsn, durable = state.append(OffsetRecord(req.consumer_group, entries))
        return ok(None, durable)  # published in log order: the records kept_at names come first


class QueryOffsetsProcessor:
    def __init__(self, broker):
        self._decode = decoder(QueryOffsetsRequest).decode
        self._b = broker

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_consumer_group(req.consumer_group)
        conn.access.require_topic(req.topic, SUB)
        # Only the master knows the group's offsets: a slave's lag behind it, and a consumer that took
        # a slave's (or a demoted master's) for its start would consume and commit from there.
        self._b.role.require_master()
        count = self._b.topics.require(req.topic)
        state = self._b.state
        committed = {}
        wait = 0  # an offset a restart left unconfirmed is answered once a slave holds it
        for q in range(count):
            off, lsn = state.offset_for_reader(req.consumer_group, req.topic, q)
            if off is not None:
                committed[q] = off
            wait = max(wait, lsn)
        maxima = {q: state.readable_end(req.topic, q) for q in range(count)}
        return ok(QueryOffsetsResponse(committed, maxima), state.published_future(wait) if wait else None)


class SendBackProcessor:
    """A message its consumer could not process: retry later through the delay levels, or DLQ."""

    def __init__(self, broker):
        self._decode = decoder(SendBackRequest).decode
        self._b = broker

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_consumer_group(req.consumer_group)
        conn.access.require_topic(req.topic, SUB)
        b = self._b
        b.role.require_master()
        try:
            m = b.reader.readable(req.msg_id, req.topic)
        except ValueError as e:
            return error(ResponseCode.MESSAGE_ILLEGAL, str(e))
        if m is None and req.message is not None and keys.parse_msg_id(req.msg_id)[0] < b.state.log_complete_from:
            m = req.message  # retention deleted it while its consumer had it: the consumer's copy goes back
        if m is None:  # a half or rolled-back message, or one of another topic, is nobody's to retry
            return error(ResponseCode.QUERY_NOT_FOUND, f"no message {req.msg_id} that a consumer can read in topic {req.topic}")
        group = req.consumer_group
        dead = req.reconsume_times >= req.max_reconsume_times
        target = dlq_topic(group) if dead else retry_topic(group)
        level = FIRST_RETRY_LEVEL + req.reconsume_times
        # Keyed on (group, message, failure count): a send-back whose answer was lost, sent again,
        # stores nothing new; a later failure of the same message is a new retry.
        once = keys.send_back_key(group, req.msg_id, req.reconsume_times)
        stored = b.state.send_back_lsn(once)
        if stored is not None:
            delay = 0 if dead else b.schedule.delay_of(level)
            return ok(SendBackResponse(target, delay), b.state.published_future(stored))
        props = {k: v for k, v in m.properties.items()
                 if k not in (PROPERTY_TRANSACTION_PREPARED, PROPERTY_PRODUCER_GROUP)}
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, req.msg_id)
        if not req.topic.startswith(RETRY_PREFIX):
            props[PROPERTY_RETRY_TOPIC] = req.topic
        props[PROPERTY_RECONSUME_TIME] = str(req.reconsume_times + 1)
        if target not in b.state.topics:
            b.topics.create(target, 1)
        msg = Message(target, m.body, m.tags, m.keys, props, 0)
        if dead:
            _lsn, _offsets, durable = b.state.append_messages(now_ms(), [msg], once)
            return ok(SendBackResponse(target, 0), durable)
        schedule: ScheduleService = b.schedule
        delay, durable = schedule.schedule(msg, level, once)
        return ok(SendBackResponse(target, delay), durable)


class LockQueuesProcessor:
    def __init__(self, broker, unlock: bool = False):
        self._decode = decoder(LockQueuesRequest).decode
        self._b = broker
        self._unlock = unlock

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_consumer_group(req.consumer_group)
        self._b.role.require_master()
        consumers = self._b.consumers
        if self._unlock:
            consumers.unlock(req.consumer_group, req.client_id, req.topic, req.queue_ids)
            return ok(LockQueuesResponse([]))
        return ok(LockQueuesResponse(consumers.lock(req.consumer_group, req.client_id, req.topic, req.queue_ids,
                                                    min(max(req.lease_ms, 100), 300_000))))


class SearchOffsetProcessor:
    """The first offset of a queue whose message was stored at or after a time (binary search)."""

    def __init__(self, broker):
        self._decode = decoder(SearchOffsetRequest).decode
        self._b = broker

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_topic(req.topic, SUB)
        self._b.role.require_current()
        self._b.topics.require(req.topic, req.queue_id)
        read = self._b.reader.read_queue
        lo = self._b.state.queue_start(req.topic, req.queue_id)  # retention deleted what was before
        hi = read(req.topic, req.queue_id, lo, 0)[2]
        while lo < hi:
            mid = (lo + hi) // 2
            msgs = read(req.topic, req.queue_id, mid, 1)[0]
            if msgs and msgs[0].store_timestamp < req.timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return ok(SearchOffsetResponse(lo))


class QueryByKeyProcessor:
    def __init__(self, broker):
        self._decode = decoder(QueryByKeyRequest).decode
        self._b = broker

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_topic(req.topic, SUB)
        self._b.role.require_current()
        self._b.topics.require(req.topic)
        if self._b.state.key_index_lag()[0]:  # keys still to be written: a slice at a time first
            return self._after_keys(req)
        return ok(QueryByKeyResponse(self._b.reader.by_key(req.topic, req.key, min(req.max_messages, 1024))))

    async def _after_keys(self, req: QueryByKeyRequest) -> Reply:
        await self._b.state.index_keys_now()
        self._b.role.require_current()  # (again: the broker may have stepped down meanwhile)
        return ok(QueryByKeyResponse(self._b.reader.by_key(req.topic, req.key, min(req.max_messages, 1024))))
