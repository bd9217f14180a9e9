"""Push consumers: a group's members share a topic's queues and get messages handed to a listener.

Clustering (default): the queues of the topic (and of the group's retry topic %RETRY%<group>) are
divided among the live members, sorted, each taking an even share (RocketMQ's
AllocateMessageQueueAveragely); a membership change announced by the broker rebalances at once.
Offsets are committed to the broker. A message whose listener answers RECONSUME_LATER (or raises)
goes back to the broker for a later retry, and to %DLQ%<group> after `max_reconsume_times`.
Delivery is at-least-once: a member that dies may have consumed messages whose offsets were not
committed yet; another member gets them again.

Orderly: each queue is consumed by one worker at a time, under a broker-held queue lock renewed
while held; SUSPEND_CURRENT_QUEUE_A_MOMENT retries the same messages after a pause, so nothing
is reordered or skipped.

Broadcasting: every member consumes every queue; offsets are kept in a local file.

A failed request of a queue's loop (a pull refused or timed out, an offset commit) is retried after
a pause that doubles up to 10 s; it is logged once, then as a count of repeats every minute, and
counted in `consumer.stats`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import inspect
import json
import logging
import os
import time
from dataclasses import dataclass, field

from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.producer import new_client_id
from txbroker.lifecycle import stop_task
from txbroker.protocol.bodies import (
    CommitOffsetsRequest, ConsumerListRequest, ConsumerListResponse, LockQueuesRequest, LockQueuesResponse,
    MessageExt, PullRequest, PullResponse, QueryOffsetsRequest, QueryOffsetsResponse, QueueOffset, RouteRequest,
    RouteResponse, SearchOffsetRequest, SearchOffsetResponse, SendBackRequest,
)
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.framing import Frame
from txbroker.protocol.names import PROPERTY_RECONSUME_TIME, RETRY_PREFIX, retry_topic
from txbroker.protocol.tags import parse_tags

log = logging.getLogger(__name__)



class ConsumeStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFrom(enum.Enum):
    FIRST = "FIRST"  # a new group starts at each queue's beginning
    LAST = "LAST"  # ... at each queue's end: only messages from now on
    TIMESTAMP = "TIMESTAMP"  # ... at the first message stored at or after consume_timestamp_ms


@dataclass
class ConsumerStats:
    """Counters a user can read: the client has no metrics registry of its own."""

    queue_errors: int = 0  # failed requests of a queue's loop (pull, offset commit, ...), each retried
    send_back_errors: int = 0  # failed send-backs of messages the listener did not consume, each retried


class _Retrying:
    """Backoff and logging for something retried until it works. A broker refusing every request
    must not fill the log: one warning when the failures start, then a count every `report_every`
    seconds, and one when it works again."""

    def __init__(self, what: str, first_delay: float = 0.5, max_delay: float = 10.0, report_every: float = 60.0):
        self.what = what
        self.first_delay, self.max_delay, self.report_every = first_delay, max_delay, report_every
        self.failures = 0  # in a row
        self._unreported = 0
        self._reported_at = 0.0

    def failed(self, error: Exception) -> float:
        """Count and perhaps log a failure; returns the pause before the next try."""
        self.failures += 1
        now = time.monotonic()
        if self.failures == 1:
            log.warning("%s failed: %s; retrying", self.what, error)
            self._reported_at, self._unreported = now, 0
        else:
            self._unreported += 1
            if now - self._reported_at >= self.report_every:
                log.warning("%s failed %d more times in the last %.0f s (%d in a row); last: %s", self.what,
                            self._unreported, now - self._reported_at, self.failures, error)
                self._reported_at, self._unreported = now, 0
        return min(self.first_delay * 2 ** min(self.failures - 1, 16), self.max_delay)

    def succeeded(self) -> None:
        if self.failures:
            log.warning("%s works again after %d failures", self.what, self.failures)
            self.failures = 0


@dataclass
class ConsumeContext:
    topic: str
    queue_id: int


def allocate_averagely(queues: list, members: list[str], me: str) -> list:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous, even shares of the sorted queues."""
    if me not in members:
        return []
    index, n, m = members.index(me), len(queues), len(members)
    share = n // m + (1 if index < n % m else 0)
    start = index * (n // m) + min(index, n % m)
    return queues[start:start + share]


@dataclass
class _Queue:
    """A queue this member consumes: where it is, and what is in flight."""

    topic: str
    queue_id: int
    next_pull: int
    in_flight: set[int] = field(default_factory=set)
    consumed_to: int = 0  # all before this are done
    committed: int = -1
    task: asyncio.Task | None = None
    locked_until: float = 0.0
    stopped: bool = False  # dropped from this member: its loop must end

    def done_offset(self) -> int:
        return min(self.in_flight) if self.in_flight else self.next_pull


class AsyncPushConsumer:
    def __init__(self, group: str, brokers, topic: str, listener, *, tags: str = "*", orderly: bool = False,
                 message_model: MessageModel = MessageModel.CLUSTERING, consume_from: ConsumeFrom = ConsumeFrom.FIRST,
                 consume_timestamp_ms: int = 0, consume_message_batch_max_size: int = 1, consume_threads: int = 8,
                 pull_batch_size: int = 32, max_reconsume_times: int = 16, heartbeat_interval: float = 10.0,
                 rebalance_interval: float = 20.0, offset_commit_interval: float = 5.0,
                 suspend_current_queue_time_ms: int = 1000, lock_lease_ms: int = 60_000, long_poll_ms: int = 15_000,
                 offset_store_dir: str | None = None, request_timeout: float = 10.0, await_termination_ms: int = 30_000,
                 credentials=None, tls=None):
        if not group:
            raise ValueError("a push consumer needs a consumer group")
        parse_tags(tags)  # raises TagExpressionError naming the bad expression
        self.group, self.topic, self.tags, self.listener = group, topic, tags, listener
        self.orderly, self.model = orderly, message_model
        self.consume_from, self.consume_timestamp_ms = consume_from, consume_timestamp_ms
        self.batch_max = max(consume_message_batch_max_size, 1)
        self.pull_batch = pull_batch_size
        self.max_reconsume_times = max_reconsume_times
        self.heartbeat_interval, self.rebalance_interval = heartbeat_interval, rebalance_interval
        self.commit_interval = offset_commit_interval
        self.suspend_s = suspend_current_queue_time_ms / 1000
        self.lease_ms = lock_lease_ms
        self.long_poll_ms = long_poll_ms
        self.client_id = new_client_id()
        self.client = BrokerClient(brokers, client_id=self.client_id, consumer_groups=[group],
                                   request_timeout=request_timeout, on_request=self._on_request,
                                   credentials=credentials, tls=tls)
        self._pool = concurrent.futures.ThreadPoolExecutor(consume_threads, thread_name_prefix=f"consume-{group}")
        self._slots = asyncio.Semaphore(consume_threads)
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._tasks: list[asyncio.Task] = []
        self._consuming: set[asyncio.Task] = set()  # batches handed to the listener (concurrent mode)
        self.await_termination_s = await_termination_ms / 1000
        self._rebalance_now = asyncio.Event()
        self._running = False
        self._closed = False
        self.stats = ConsumerStats()
        self._send_back_retrying = _Retrying(f"consumer {group}: sending messages back")
        self._offset_file = (os.path.join(offset_store_dir or os.path.expanduser("~/.txbroker/offsets"),
                                          f"{group}.json") if message_model is MessageModel.BROADCASTING else None)

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> "AsyncPushConsumer":
        self._running = True
        await self._queue_count(self.topic)  # fails fast on an unknown topic
        await self.client.heartbeat()
        await self._rebalance()
        self._tasks = [asyncio.ensure_future(self._every(self.heartbeat_interval, self.client.heartbeat)),
                       asyncio.ensure_future(self._rebalancer()),
                       asyncio.ensure_future(self._every(self.commit_interval, self.commit_offsets))]
        return self

    async def shutdown(self) -> None:
        """Stop pulling, let in-flight messages finish (at most `await_termination_ms`), commit offsets,
        release locks, leave the group."""
        self._running = False
        self._rebalance_now.set()
        for t in self._tasks:
            await stop_task(t)
        for q in list(self._queues.values()):
            q.stopped = True
            await stop_task(q.task)
        # A batch the listener fails now must still go back to the broker before the commit below
        # moves past it; one still running when the wait ends keeps its offset held.
        if self._consuming:
            await asyncio.wait(set(self._consuming), timeout=self.await_termination_s)
        for q in list(self._queues.values()):
            await self._drop(q)
        try:
            await self.client.request(RequestCode.UNREGISTER_CLIENT, ConsumerListRequest(self.group), retry=False)
        except ClientError:
            pass
        self._closed = True
        await self.client.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.shutdown()

    async def _every(self, interval: float, fn) -> None:
        while self._running:
            await asyncio.sleep(interval)
            try:
                await fn()
            except ClientError as e:
                log.warning("consumer %s: %s failed: %s", self.group, fn.__name__, e)

    def _on_request(self, conn, frame: Frame) -> None:
        if frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            self._rebalance_now.set()

    # ---- rebalance ---------------------------------------------------------------------------------

    async def _rebalancer(self) -> None:
        while self._running:
            try:
                await asyncio.wait_for(self._rebalance_now.wait(), self.rebalance_interval)
            except asyncio.TimeoutError:
                pass
            self._rebalance_now.clear()
            try:
                await self._rebalance()
            except ClientError as e:
                log.warning("consumer %s: rebalance failed: %s", self.group, e)

    async def _queue_count(self, topic: str) -> int | None:
        try:
            r: RouteResponse = await self.client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, RouteRequest(topic), RouteResponse)
        except BrokerError as e:
            if e.code == ResponseCode.TOPIC_NOT_EXIST and topic.startswith(RETRY_PREFIX):
                return None  # no retries yet
            raise
        return r.queue_count

    async def _rebalance(self) -> None:
        if not self._running:
            return
        topics = [self.topic]
        if self.model is MessageModel.CLUSTERING:
            topics.append(retry_topic(self.group))
        wanted: list[tuple[str, int]] = []
        members = None
        for topic in topics:
            count = await self._queue_count(topic)
            if not count:
                continue
            queues = [(topic, q) for q in range(count)]
            if self.model is MessageModel.BROADCASTING:
                wanted += queues
                continue
            if members is None:
                r: ConsumerListResponse = await self.client.request(
                    RequestCode.GET_CONSUMER_LIST_BY_GROUP, ConsumerListRequest(self.group), ConsumerListResponse)
                members = r.client_ids
            wanted += allocate_averagely(queues, members, self.client_id)
        for key in [k for k in self._queues if k not in wanted]:
            await self._drop(self._queues[key])
        new = [k for k in wanted if k not in self._queues]
        if new:
            starts = await self._start_offsets(new)
            for key in new:
                q = self._queues[key] = _Queue(key[0], key[1], starts[key], consumed_to=starts[key], committed=starts[key])
                q.task = asyncio.ensure_future(self._consume_queue(q))
            log.info("consumer %s (%s) now consumes %s", self.group, self.client_id,
                     sorted(f"{t}:{q}" for t, q in self._queues))

    async def _start_offsets(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        out = {}
        stored = self._load_local_offsets() if self._offset_file else None
        for topic in {t for t, _ in keys}:
            r: QueryOffsetsResponse = await self.client.request(
                RequestCode.QUERY_CONSUMER_OFFSET, QueryOffsetsRequest(self.group, topic), QueryOffsetsResponse)
            committed = {int(q): o for q, o in (stored or {}).get(topic, {}).items()} if stored is not None else r.offsets
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
                    s: SearchOffsetResponse = await self.client.request(
                        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, SearchOffsetRequest(t, q, self.consume_timestamp_ms),
                        SearchOffsetResponse)
                    out[(t, q)] = s.offset
        return out

    async def _drop(self, q: _Queue) -> None:
        key = (q.topic, q.queue_id)
        q.stopped = True
        await stop_task(q.task)
        try:
            await self.commit_offsets([q])
        except ClientError as e:  # at-least-once: whoever takes the queue on starts at the last commit
            log.warning("consumer %s: offset of %s:%d not committed on leaving it (%s); messages after the last "
                        "committed offset will be delivered again", self.group, q.topic, q.queue_id, e)
        self._queues.pop(key, None)
        if self.orderly and q.locked_until:
            try:
                await self.client.request(RequestCode.UNLOCK_BATCH_MQ, LockQueuesRequest(
                    self.group, self.client_id, q.topic, [q.queue_id]), LockQueuesResponse, retry=False)
            except ClientError:
                pass

    # ---- pulling and consuming ---------------------------------------------------------------------

    async def _consume_queue(self, q: _Queue) -> None:
        # Nothing else would ever read this queue again if its loop ended: every failure is retried.
        retrying = _Retrying(f"consumer {self.group}: queue {q.topic}:{q.queue_id}")
        while self._running and not q.stopped:
            try:
                await self._pull_and_consume(q)
            except ClientError as e:
                self.stats.queue_errors += 1
                await asyncio.sleep(retrying.failed(e))
            else:
                retrying.succeeded()

    async def _pull_and_consume(self, q: _Queue) -> None:
        if self.orderly and not await self._hold_lock(q):
            await asyncio.sleep(min(self.lease_ms / 3000, 1.0))
            return
        tags = "" if q.topic.startswith(RETRY_PREFIX) else self.tags
        try:
            r: PullResponse = await self.client.request(
                RequestCode.PULL_MESSAGE,
                PullRequest(q.topic, q.queue_id, q.next_pull, self.pull_batch, self.long_poll_ms, self.group, tags),
                PullResponse, timeout=self.client.request_timeout + self.long_poll_ms / 1000)
        except BrokerError as e:
            if e.code != ResponseCode.PULL_OFFSET_MOVED:
                raise
            q.next_pull = q.consumed_to = await self._moved(q, e.remark)
            return
        if q.stopped:
            return  # not ours any more: another member consumes from the committed offset
        msgs = [self._present(m) for m in r.messages]
        if not msgs:
            q.next_pull = r.next_offset
            return
        if self.orderly:
            await self._consume_orderly(q, msgs)
        else:
            for i in range(0, len(msgs), self.batch_max):
                batch = msgs[i:i + self.batch_max]
                q.in_flight.update(m.queue_offset for m in batch)
                await self._slots.acquire()
                task = asyncio.ensure_future(self._consume_concurrently(q, batch))
                self._consuming.add(task)
                task.add_done_callback(self._consuming.discard)
        q.next_pull = r.next_offset

    async def _moved(self, q: _Queue, why: str) -> int:
        """Where to go on after PULL_OFFSET_MOVED: below the queue's first stored message (retention
        deleted what was before it), to that message, as RocketMQ does; beyond its end, to its end."""
        s: SearchOffsetResponse = await self.client.request(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, SearchOffsetRequest(q.topic, q.queue_id, 0), SearchOffsetResponse)
        if q.next_pull < s.offset:
            log.warning("consumer %s: %s; going on at %s:%d's first message (%d)", self.group, why, q.topic,
                        q.queue_id, s.offset)
            return s.offset
        log.warning("consumer %s: %s; starting %s:%d at its end", self.group, why, q.topic, q.queue_id)
        return await self._start_offsets_at_end(q)

    async def _start_offsets_at_end(self, q: _Queue) -> int:
        r: QueryOffsetsResponse = await self.client.request(
            RequestCode.QUERY_CONSUMER_OFFSET, QueryOffsetsRequest(self.group, q.topic), QueryOffsetsResponse)
        return r.max_offsets.get(q.queue_id, 0)

    @staticmethod
    def _present(m: MessageExt) -> MessageExt:
        """Messages from the retry topic show their original topic and how often they were retried."""
        p = m.properties
        if PROPERTY_RECONSUME_TIME in p:
            m.reconsume_times = int(p[PROPERTY_RECONSUME_TIME])
        return m

    async def _call_listener(self, msgs: list[MessageExt], ctx: ConsumeContext):
        fn = getattr(self.listener, "consume_message", self.listener)
        if inspect.iscoroutinefunction(fn):
            return await fn(msgs, ctx)
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, msgs, ctx)

    async def _consume_concurrently(self, q: _Queue, msgs: list[MessageExt]) -> None:
        try:
            try:
                status = await self._call_listener(msgs, ConsumeContext(q.topic, q.queue_id))
            except Exception:
                log.exception("consumer %s: listener raised; messages will be consumed again later", self.group)
                status = ConsumeStatus.RECONSUME_LATER
            if status is not ConsumeStatus.CONSUME_SUCCESS:
                for m in msgs:
                    await self._send_back(q, m)
        finally:
            self._slots.release()
            q.in_flight.difference_update(m.queue_offset for m in msgs)

    async def _send_back(self, q: _Queue, m: MessageExt) -> None:
        if self.model is MessageModel.BROADCASTING:
            log.warning("consumer %s: broadcasting mode has no retries; message %s dropped", self.group, m.msg_id)
            return
        # Until the client closes, not while running: a batch failing as shutdown begins still goes
        # back. The offset stays held (in flight) until the broker has the message.
        while not self._closed:
            try:
                await self.client.request(RequestCode.CONSUMER_SEND_MSG_BACK, SendBackRequest(
                    self.group, m.msg_id, q.topic, m.reconsume_times, self.max_reconsume_times))
                self._send_back_retrying.succeeded()
                return
            except ClientError as e:
                self.stats.send_back_errors += 1
                await asyncio.sleep(self._send_back_retrying.failed(e))

    async def _consume_orderly(self, q: _Queue, msgs: list[MessageExt]) -> None:
        i = 0
        while i < len(msgs):
            if not self._running or q.stopped or not await self._hold_lock(q):
                q.next_pull = msgs[i].queue_offset  # pull again from the first unconsumed one
                return
            batch = msgs[i:i + self.batch_max]
            q.in_flight.update(m.queue_offset for m in batch)
            try:
                status = await self._call_listener(batch, ConsumeContext(q.topic, q.queue_id))
            except Exception:
                log.exception("consumer %s: orderly listener raised; suspending the queue", self.group)
                status = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            if status is ConsumeOrderlyStatus.SUCCESS:
                q.in_flight.difference_update(m.queue_offset for m in batch)
                q.consumed_to = batch[-1].queue_offset + 1
                i += len(batch)
            else:
                q.in_flight.difference_update(m.queue_offset for m in batch)
                for m in batch:
                    m.reconsume_times += 1
                await asyncio.sleep(self.suspend_s)
        q.next_pull = msgs[-1].queue_offset + 1
        await self.commit_offsets([q])

    async def _hold_lock(self, q: _Queue) -> bool:
        now = time.monotonic()
        if q.locked_until - now > self.lease_ms / 1000 * 2 / 3:
            return True
        try:
            r: LockQueuesResponse = await self.client.request(RequestCode.LOCK_BATCH_MQ, LockQueuesRequest(
                self.group, self.client_id, q.topic, [q.queue_id], self.lease_ms), LockQueuesResponse)
        except ClientError as e:
            log.warning("consumer %s: lock of %s:%d failed: %s", self.group, q.topic, q.queue_id, e)
            return q.locked_until > time.monotonic()
        if q.queue_id in r.locked:
            q.locked_until = now + self.lease_ms / 1000 * 0.9  # renew well before the broker's lease ends
            return True
        q.locked_until = 0.0
        return False

    # ---- offsets -------------------------------------------------------------------------------------

    async def commit_offsets(self, queues: list[_Queue] | None = None) -> None:
        changed = []
        for q in queues if queues is not None else list(self._queues.values()):
            off = q.done_offset() if not self.orderly else q.consumed_to
            if off != q.committed:
                changed.append((q, off))
        if not changed:
            return
        if self._offset_file:
            self._store_local_offsets(changed)
        else:
            await self.client.request(RequestCode.UPDATE_CONSUMER_OFFSET, CommitOffsetsRequest(
                self.group, [QueueOffset(q.topic, q.queue_id, off) for q, off in changed]))
        for q, off in changed:
            q.committed = off

    def _load_local_offsets(self) -> dict:
        try:
            with open(self._offset_file) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def _store_local_offsets(self, changed) -> None:
        doc = self._load_local_offsets()
        for q, off in changed:
            doc.setdefault(q.topic, {})[str(q.queue_id)] = off
        os.makedirs(os.path.dirname(self._offset_file), exist_ok=True)
        tmp = self._offset_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._offset_file)

    @property
    def assigned(self) -> list[tuple[str, int]]:
        return sorted(self._queues)


class PushConsumer:
    """Blocking form of AsyncPushConsumer: start(), shutdown(); the listener runs on a thread pool."""

    def __init__(self, group: str, brokers, topic: str, listener, **kwargs):
        parse_tags(kwargs.get("tags", "*"))  # a bad expression fails here, naming it
        self._args = (group, brokers, topic, listener, kwargs)
        self._async: AsyncPushConsumer | None = None

    def start(self) -> "PushConsumer":
        group, brokers, topic, listener, kwargs = self._args

        async def make():
            self._async = AsyncPushConsumer(group, brokers, topic, listener, **kwargs)
            return await self._async.start()

        background.run(make())
        return self

    @property
    def assigned(self) -> list[tuple[str, int]]:
        return self._async.assigned if self._async else []

    @property
    def stats(self) -> ConsumerStats:
        return self._async.stats if self._async else ConsumerStats()

    def shutdown(self) -> None:
        if self._async is not None:
            background.run(self._async.shutdown())

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.shutdown()
