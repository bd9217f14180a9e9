"""Reading stored messages: by queue and offset, and by message id."""

from __future__ import annotations

from collections import OrderedDict

from txbroker.protocol.bodies import MessageExt
from txbroker.protocol.names import PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED
from txbroker.store import keys
from txbroker.store.records import COMMITTED, HalfRecord, NormalRecord, Record, decode_record
from txbroker.store.state import StateMachine


# Runs of index entries whose record retention deleted, examined at most per read: a read past
# more goes on from there at the next one (its next offset), never holding the loop for long.
MAX_DEAD_RUNS = 1024


class MessageReader:
    def __init__(self, state: StateMachine, cache_records: int = 256):
        self._state = state
        self._cache: OrderedDict[int, Record] = OrderedDict()
        self._cache_size = cache_records
        state.on_truncate.append(self._cache.clear)  # a truncated LSN may come back with another record

    def record(self, lsn: int) -> Record | None:
        cache = self._cache
        rec = cache.get(lsn)
        if rec is not None:
            cache.move_to_end(lsn)
            return rec
        raw = self._state.db.log.get(keys.lsn_key(lsn))
        if raw is None:
            return None
        rec = decode_record(raw)
        cache[lsn] = rec
        if len(cache) > self._cache_size:
            cache.popitem(last=False)
        return rec

    def read_queue(self, topic: str, queue_id: int, offset: int, max_messages: int) -> tuple[list[MessageExt], int, int]:
        """Up to `max_messages` durable messages of one queue from `offset`; returns (messages, next
        offset, queue end). Offsets retention emptied behind a record it keeps are passed over, as
        Kafka's fetch passes over a compacted range: a reader there goes on from the next message
        (nothing readable up to the end: from the end), never stays where it is."""
        prefix = keys.queue_prefix(topic, queue_id)
        end = self._state.readable_end(topic, queue_id)
        if offset >= end or max_messages <= 0:
            return [], offset, end
        out: list[MessageExt] = []
        append = out.append
        view = self.view
        left, dead = max_messages, 0
        for first, lsn, index, count in self._runs(prefix, offset, end):
            if self.record(lsn) is None:  # deleted by retention behind a record it keeps
                dead += 1
                if dead == MAX_DEAD_RUNS:  # (a store from before 6396a24 may hold many): go on next time
                    return out, (out[-1].queue_offset + 1) if out else first + count, end
                continue
            start = max(first, offset)
            upto = min(first + count, end, start + left)
            for off in range(start, upto):
                append(view(lsn, index + off - first, topic, queue_id, off))
            left -= upto - start
            if not left:
                break
        return out, (out[-1].queue_offset + 1) if out else end, end

    def _runs(self, prefix: bytes, offset: int, stop: int):
        """The queue-index runs of one queue that hold offsets in [offset, stop), in order:
        (first offset, LSN, index of its first message in that record, count)."""
        it = self._state.db.cq.iter()
        it.seek_for_prev(keys.cq_key(prefix, offset))  # the run that may start before `offset`
        if not (it.valid() and it.key().startswith(prefix)):
            it.seek(keys.cq_key(prefix, offset))
        decode_run = keys.cq_run_decode
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            first = keys.cq_offset(key)
            if first >= stop:
                return
            lsn, index, count = decode_run(it.value())
            if first + count > offset:
                yield first, lsn, index, count
            it.next()

    def view(self, lsn: int, idx: int, topic: str, queue_id: int, offset: int) -> MessageExt:
        rec = self.record(lsn)
        m = rec.messages[idx]
        txid = rec.transaction_id if type(rec) is HalfRecord else ""
        return MessageExt(
            msg_id=keys.msg_id(lsn, idx), topic=topic, queue_id=queue_id, queue_offset=offset,
            body=m.body, tags=m.tags, keys=m.keys, properties=m.properties,
            born_timestamp=rec.born_ms, store_timestamp=rec.born_ms, transaction_id=txid,
        )

    def by_id(self, msg_id: str) -> tuple[MessageExt, Record] | None:
        """The stored message with this id, whether or not it is visible (see the record's kind)."""
        lsn, idx = keys.parse_msg_id(msg_id)
        rec = self.record(lsn)
        if rec is None or type(rec) not in (HalfRecord, NormalRecord) or idx >= len(rec.messages):
            return None
        m = rec.messages[idx]
        if type(rec) is NormalRecord:
            return self.view(lsn, idx, m.topic, m.queue_id, rec.queue_offsets[idx]), rec
        ext = self.view(lsn, idx, m.topic, m.queue_id, -1)
        ext.properties = {**m.properties, PROPERTY_TRANSACTION_PREPARED: "true",
                          PROPERTY_PRODUCER_GROUP: rec.producer_group}
        return ext, rec

    def readable(self, msg_id: str, topic: str) -> MessageExt | None:
        """The message with this id if a consumer of `topic` could read it: stored in that topic and
        published (for a transactional message: committed). None for anything else, half messages
        included. Raises ValueError for a malformed id."""
        lsn, idx = keys.parse_msg_id(msg_id)
        rec = self.record(lsn)
        kind = type(rec)
        if kind is NormalRecord and idx < len(rec.messages):
            offset = rec.queue_offsets[idx]
        elif kind is HalfRecord and idx < len(rec.messages):
            done = self._state.finished(rec.transaction_id)
            if done is None or done.state != COMMITTED or done.half_lsn != lsn:
                return None
            offset = done.queue_offsets[idx]
        else:
            return None
        m = rec.messages[idx]
        if m.topic != topic or offset >= self._state.readable_end(topic, m.queue_id):
            return None
        return self.view(lsn, idx, topic, m.queue_id, offset)

    def by_key(self, topic: str, key: str, limit: int) -> list[MessageExt]:
        """Up to `limit` published messages of `topic` stored under message key `key`, oldest first
        (a commit indexes its keys before it is published: those wait, as consumers do). The key index
        is written behind the log: what is still to be written is written first."""
        self._state.key_index.catch_up()
        prefix = keys.key_index_prefix(topic, key)
        out: list[MessageExt] = []
        for k, v in self._state.db.keys.items(from_key=prefix):
            if not k.startswith(prefix) or len(out) >= limit:
                break
            lsn, idx = keys.cq_value_decode(k[len(prefix):])
            offset = keys.lsn_from_key(v)
            rec = self.record(lsn)
            if rec is None:  # an entry a store before 6396a24 left behind its deleted record
                continue
            queue_id = rec.messages[idx].queue_id
            if offset < self._state.readable_end(topic, queue_id):
                out.append(self.view(lsn, idx, topic, queue_id, offset))
        return out

    def half_message(self, lsn: int) -> tuple[MessageExt, int] | None:
        """First message of a half record (what a check-back shows the producer) and the count."""
        got = self.by_id(keys.msg_id(lsn, 0))
        if got is None:
            return None
        ext, rec = got
        return ext, len(rec.messages)
