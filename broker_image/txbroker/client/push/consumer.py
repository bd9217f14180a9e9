"""The push consumer's face: its options, start and shutdown, and the blocking form. The work is
done by the parts it wires together: rebalance.py, pulling.py, consuming.py, queue_locks.py,
offsets.py."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os

from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import ClientError
from txbroker.client.producer import new_client_id
from txbroker.client.push.consuming import ConcurrentConsumption, Listener, OrderlyConsumption, SendBack
from txbroker.client.push.member import Member
from txbroker.client.push.offsets import BrokerOffsetStore, LocalOffsetStore, OffsetStore
from txbroker.client.push.process_queue import ProcessQueue
from txbroker.client.push.pulling import Puller
from txbroker.client.push.queue_locks import QueueLocks
from txbroker.client.push.rebalance import Rebalancer
from txbroker.client.push.structs import ConsumeFrom, ConsumerStats, MessageModel
from txbroker.lifecycle import stop_task
from txbroker.protocol.bodies import ConsumerListRequest
from txbroker.protocol.codes import RequestCode
from txbroker.protocol.framing import Frame
from txbroker.protocol.tags import parse_tags

log = logging.getLogger(__name__)


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
        self.await_termination_s = await_termination_ms / 1000
        self.client_id = new_client_id()
        self.client = BrokerClient(brokers, client_id=self.client_id, consumer_groups=[group],
                                   request_timeout=request_timeout, on_request=self._on_request,
                                   credentials=credentials, tls=tls)
        self._member = Member(group, self.client_id, self.client)
        self._pool = concurrent.futures.ThreadPoolExecutor(consume_threads, thread_name_prefix=f"consume-{group}")
        self._tasks: list[asyncio.Task] = []

        self._offsets: OffsetStore
        if message_model is MessageModel.BROADCASTING:
            path = os.path.join(offset_store_dir or os.path.expanduser("~/.txbroker/offsets"), f"{group}.json")
            self._offsets = LocalOffsetStore(path, orderly)
        else:
            self._offsets = BrokerOffsetStore(self._member, orderly)
        locks = QueueLocks(self._member, lock_lease_ms) if orderly else None
        call = Listener(listener, self._pool)
        self._consumption: ConcurrentConsumption | OrderlyConsumption
        if orderly:
            self._consumption = OrderlyConsumption(self._member, call, locks, self._offsets, self.batch_max,
                                                   self.suspend_s)
        else:
            self._consumption = ConcurrentConsumption(
                self._member, call, SendBack(self._member, message_model, max_reconsume_times), consume_threads,
                self.batch_max)
        self._puller = Puller(self._member, self._consumption, locks, tags=tags, pull_batch=pull_batch_size,
                              long_poll_ms=long_poll_ms)
        self._rebalancer = Rebalancer(self._member, self._puller, self._offsets, locks, topic=topic,
                                      model=message_model, consume_from=consume_from,
                                      consume_timestamp_ms=consume_timestamp_ms, interval=rebalance_interval)

    @property
    def stats(self) -> ConsumerStats:
        return self._member.stats

    @property
    def assigned(self) -> list[tuple[str, int]]:
        return sorted(self._rebalancer.queues)

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> "AsyncPushConsumer":
        self._member.running = True
        await self._rebalancer.queue_count(self.topic)  # fails fast on an unknown topic
        await self.client.heartbeat()
        await self._rebalancer.rebalance()
        self._tasks = [asyncio.ensure_future(self._every(self.heartbeat_interval, self.client.heartbeat)),
                       asyncio.ensure_future(self._rebalancer.run()),
                       asyncio.ensure_future(self._every(self.commit_interval, self.commit_offsets))]
        return self

    async def shutdown(self) -> None:
        """Stop pulling, let in-flight messages finish (at most `await_termination_ms`), commit offsets,
        release locks, leave the group."""
        self._member.running = False
        self._rebalancer.wake()
        for t in self._tasks:
            await stop_task(t)
        await self._rebalancer.stop_pulling()
        await self._consumption.wait(self.await_termination_s)
        await self._rebalancer.drop_all()
        if self._tasks:  # started: leave the group at once (closing the connection also takes it out)
            try:
                await self.client.request(RequestCode.UNREGISTER_CLIENT, ConsumerListRequest(self.group), retry=False)
            except ClientError:
                pass
        self._member.closed = True
        await self.client.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.shutdown()

    async def _every(self, interval: float, fn) -> None:
        """`fn` every `interval` until shutdown; a failure is logged and the next round goes on (a
        dead heartbeat loop would leave the member out of its group for good)."""
        while self._member.running:
            await asyncio.sleep(interval)
            try:
                await fn()
            except ClientError as e:
                log.warning("consumer %s: %s failed: %s", self.group, fn.__name__, e)
            except Exception:  # noqa: BLE001 - a bug must not end the loop; it says so with its traceback
                log.exception("consumer %s: %s failed", self.group, fn.__name__)

    def _on_request(self, conn, frame: Frame) -> None:
        if frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            self._rebalancer.wake()

    # ---- offsets -------------------------------------------------------------------------------------

    async def commit_offsets(self, queues: list[ProcessQueue] | None = None) -> None:
        await self._offsets.commit(queues if queues is not None else list(self._rebalancer.queues.values()))


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
