"""The pull loop of each queue this member consumes: long-polls the broker from the queue's next
offset and hands what comes to the consumption (concurrent or orderly)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.push.retrying import Retrying
from txbroker.lifecycle import stop_task
from txbroker.protocol.bodies import (
    MessageExt, PullRequest, PullResponse, QueryOffsetsRequest, QueryOffsetsResponse, SearchOffsetRequest,
    SearchOffsetResponse,
)
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.names import PROPERTY_RECONSUME_TIME, RETRY_PREFIX

if TYPE_CHECKING:
    from txbroker.client.push.consuming import ConcurrentConsumption, OrderlyConsumption
    from txbroker.client.push.member import Member
    from txbroker.client.push.process_queue import ProcessQueue
    from txbroker.client.push.queue_locks import QueueLocks

log = logging.getLogger(__name__)


class Puller:
    def __init__(self, member: Member, consumption: ConcurrentConsumption | OrderlyConsumption,
                 locks: QueueLocks | None, *, tags: str, pull_batch: int, long_poll_ms: int):
        self.member = member
        self.consumption = consumption
        self.locks = locks  # orderly only: a queue is pulled only while its lock is held
        self.tags = tags
        self.pull_batch = pull_batch
        self.long_poll_ms = long_poll_ms

    def start(self, q: ProcessQueue) -> None:
        q.task = asyncio.ensure_future(self._loop(q))

    async def stop(self, q: ProcessQueue) -> None:
        q.stopped = True
        await stop_task(q.task)

    async def _loop(self, q: ProcessQueue) -> None:
        # Nothing else would ever read this queue again if its loop ended: every failure is retried.
        retrying = Retrying(f"consumer {self.member.group}: queue {q.topic}:{q.queue_id}")
        while self.member.running and not q.stopped:
            try:
                await self._pull_and_consume(q)
            except ClientError as e:
                self.member.stats.queue_errors += 1
                await asyncio.sleep(retrying.failed(e))
            else:
                retrying.succeeded()

    async def _pull_and_consume(self, q: ProcessQueue) -> None:
        if self.locks is not None and not await self.locks.hold(q):
            await asyncio.sleep(self.locks.retry_after)
            return
        tags = "" if q.topic.startswith(RETRY_PREFIX) else self.tags
        client = self.member.client
        try:
            r: PullResponse = await client.request(
                RequestCode.PULL_MESSAGE,
                PullRequest(q.topic, q.queue_id, q.next_pull, self.pull_batch, self.long_poll_ms, self.member.group, tags),
                PullResponse, timeout=client.request_timeout + self.long_poll_ms / 1000)
        except BrokerError as e:
            if e.code != ResponseCode.PULL_OFFSET_MOVED:
                raise
            q.next_pull = q.consumed_to = await self._moved(q, e.remark)
            return
        if q.stopped:
            return  # not ours any more: another member consumes from the committed offset
        msgs = [_present(m) for m in r.messages]
        if not msgs:
            q.next_pull = r.next_offset
            return
        # Orderly consumption that lost the queue's lock stopped early: it says where to go on.
        stopped_at = await self.consumption.hand_over(q, msgs)
        q.next_pull = r.next_offset if stopped_at is None else stopped_at

    async def _moved(self, q: ProcessQueue, why: str) -> int:
        """Where to go on after PULL_OFFSET_MOVED: below the queue's first stored message (retention
        deleted what was before it), to that message, as RocketMQ does; beyond its end, to its end."""
        m = self.member
        s: SearchOffsetResponse = await m.client.request(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, SearchOffsetRequest(q.topic, q.queue_id, 0), SearchOffsetResponse)
        if q.next_pull < s.offset:
            log.warning("consumer %s: %s; going on at %s:%d's first message (%d): %d messages never consumed",
                        m.group, why, q.topic, q.queue_id, s.offset, s.offset - q.next_pull)
            m.stats.skipped(q.topic, q.queue_id, q.next_pull, s.offset)
            return s.offset
        log.warning("consumer %s: %s; starting %s:%d at its end", m.group, why, q.topic, q.queue_id)
        r: QueryOffsetsResponse = await m.client.request(
            RequestCode.QUERY_CONSUMER_OFFSET, QueryOffsetsRequest(m.group, q.topic), QueryOffsetsResponse)
        return r.max_offsets.get(q.queue_id, 0)


def _present(m: MessageExt) -> MessageExt:
    """Messages from the retry topic show their original topic and how often they were retried."""
    p = m.properties
    if PROPERTY_RECONSUME_TIME in p:
        m.reconsume_times = int(p[PROPERTY_RECONSUME_TIME])
    return m
