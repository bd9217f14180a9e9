"""Which queues this member consumes, and from where. Clustering: the queues of the topic and of the
group's retry topic are divided among the group's live members (allocate_averagely), again whenever
the broker announces a membership change and every `interval` seconds. Broadcasting: all of them."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.push.process_queue import ProcessQueue
from txbroker.client.push.structs import ConsumeFrom, MessageModel
from txbroker.protocol.bodies import (
    ConsumerListRequest, ConsumerListResponse, QueryOffsetsRequest, QueryOffsetsResponse, RouteRequest,
    RouteResponse, SearchOffsetRequest, SearchOffsetResponse,
)
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.names import RETRY_PREFIX, retry_topic

if TYPE_CHECKING:
    from txbroker.client.push.member import Member
    from txbroker.client.push.offsets import OffsetStore
    from txbroker.client.push.pulling import Puller
    from txbroker.client.push.queue_locks import QueueLocks

log = logging.getLogger(__name__)


def allocate_averagely(queues: list, members: list[str], me: str) -> list:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous, even shares of the sorted queues."""
    if me not in members:
        return []
    index, n, m = members.index(me), len(queues), len(members)
    share = n // m + (1 if index < n % m else 0)
    start = index * (n // m) + min(index, n % m)
    return queues[start:start + share]


class Rebalancer:
    def __init__(self, member: Member, puller: Puller, offsets: OffsetStore, locks: QueueLocks | None, *,
                 topic: str, model: MessageModel, consume_from: ConsumeFrom, consume_timestamp_ms: int,
                 interval: float):
        self.member = member
        self.puller = puller
        self.offsets = offsets
        self.locks = locks
        self.topic = topic
        self.model = model
        self.consume_from, self.consume_timestamp_ms = consume_from, consume_timestamp_ms
        self.interval = interval
        self.queues: dict[tuple[str, int], ProcessQueue] = {}
        self._now = asyncio.Event()

    def wake(self) -> None:
        """Rebalance at once (the group's members changed, or the consumer is stopping)."""
        self._now.set()

    async def run(self) -> None:
        while self.member.running:
            try:
                await asyncio.wait_for(self._now.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            self._now.clear()
            try:
                await self.rebalance()
            except ClientError as e:
                log.warning("consumer %s: rebalance failed: %s", self.member.group, e)

    async def queue_count(self, topic: str) -> int | None:
        try:
            r: RouteResponse = await self.member.client.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, RouteRequest(topic), RouteResponse)
        except BrokerError as e:
            if e.code == ResponseCode.TOPIC_NOT_EXIST and topic.startswith(RETRY_PREFIX):
                return None  # no retries yet
            raise
        return r.queue_count

    async def rebalance(self) -> None:
        m = self.member
        if not m.running:
            return
        topics = [self.topic]
        if self.model is MessageModel.CLUSTERING:
            topics.append(retry_topic(m.group))
        wanted: list[tuple[str, int]] = []
        members = None
        for topic in topics:
            count = await self.queue_count(topic)
            if not count:
                continue
            queues = [(topic, q) for q in range(count)]
            if self.model is MessageModel.BROADCASTING:
                wanted += queues
                continue
            if members is None:
                r: ConsumerListResponse = await m.client.request(
                    RequestCode.GET_CONSUMER_LIST_BY_GROUP, ConsumerListRequest(m.group), ConsumerListResponse)
                members = r.client_ids
            wanted += allocate_averagely(queues, members, m.client_id)
        for key in [k for k in self.queues if k not in wanted]:
            await self.drop(self.queues[key])
        new = [k for k in wanted if k not in self.queues]
        if new:
            starts = await self._start_offsets(new)
            for key in new:
                q = self.queues[key] = ProcessQueue(key[0], key[1], starts[key], consumed_to=starts[key],
                                                    committed=starts[key])
                self.puller.start(q)
            log.info("consumer %s (%s) now consumes %s", m.group, m.client_id,
                     sorted(f"{t}:{q}" for t, q in self.queues))

    async def _start_offsets(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Where each new queue starts: at the group's committed offset, else where `consume_from`
        says (a retry topic always from its beginning)."""
        m = self.member
        out = {}
        for topic in {t for t, _ in keys}:
            r: QueryOffsetsResponse = await m.client.request(
                RequestCode.QUERY_CONSUMER_OFFSET, QueryOffsetsRequest(m.group, topic), QueryOffsetsResponse)
            committed = self.offsets.committed(topic, r.offsets)
            for t, q in keys:
                if t != topic:
                    continue
                if q in committed:
                    out[(t, q)] = committed[q]
                elif topic.startswith(RETRY_PREFIX) or self.consume_from is ConsumeFrom.FIRST:
                    out[(t, q)] = 0
                elif self.consume_from is ConsumeFrom.LAST:
                    out[(t, q)] = r.max_offsets.get(q, 0)
                else:
                    s: SearchOffsetResponse = await m.client.request(
                        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, SearchOffsetRequest(t, q, self.consume_timestamp_ms),
                        SearchOffsetResponse)
                    out[(t, q)] = s.offset
        return out

    async def stop_pulling(self) -> None:
        for q in list(self.queues.values()):
            await self.puller.stop(q)

    async def drop_all(self) -> None:
        for q in list(self.queues.values()):
            await self.drop(q)

    async def drop(self, q: ProcessQueue) -> None:
        await self.puller.stop(q)
        try:
            await self.offsets.commit([q])
        except ClientError as e:  # at-least-once: whoever takes the queue on starts at the last commit
            log.warning("consumer %s: offset of %s:%d not committed on leaving it (%s); messages after the last "
                        "committed offset will be delivered again", self.member.group, q.topic, q.queue_id, e)
        self.queues.pop(q.key, None)
        if self.locks is not None:
            await self.locks.release(q)
