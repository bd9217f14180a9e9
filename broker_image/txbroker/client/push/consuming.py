"""Handing pulled messages to the listener: concurrently (batches on a bounded pool, any order; what
the listener does not consume goes back to the broker for a later retry) or orderly (one batch of a
queue at a time, under its lock; what it does not consume is tried again after a pause)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from typing import TYPE_CHECKING

from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.push.retrying import Retrying
from txbroker.client.push.structs import ConsumeContext, ConsumeOrderlyStatus, ConsumeStatus, MessageModel
from txbroker.protocol.bodies import Message, MessageExt, SendBackRequest
from txbroker.protocol.codes import RequestCode, ResponseCode

if TYPE_CHECKING:
    from txbroker.client.push.member import Member
    from txbroker.client.push.offsets import OffsetStore
    from txbroker.client.push.process_queue import ProcessQueue
    from txbroker.client.push.queue_locks import QueueLocks

log = logging.getLogger(__name__)


class Listener:
    """The user's listener: an object with consume_message or a function, a coroutine or not; one
    that blocks runs on the pool so it cannot stall the event loop."""

    def __init__(self, listener, pool: concurrent.futures.Executor):
        self.listener = listener
        self.pool = pool

    async def __call__(self, msgs: list[MessageExt], ctx: ConsumeContext):
        fn = getattr(self.listener, "consume_message", self.listener)
        if inspect.iscoroutinefunction(fn):
            return await fn(msgs, ctx)
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, msgs, ctx)


class SendBack:
    """Returns a message to the broker, which stores it for a retry (%RETRY%<group>, after a delay
    growing with each retry) or, after `max_reconsume_times`, in %DLQ%<group>."""

    def __init__(self, member: Member, model: MessageModel, max_reconsume_times: int):
        self.member = member
        self.model = model
        self.max_reconsume_times = max_reconsume_times
        self.retrying = Retrying(f"consumer {member.group}: sending messages back")

    async def __call__(self, q: ProcessQueue, m: MessageExt) -> None:
        member = self.member
        if self.model is MessageModel.BROADCASTING:
            log.warning("consumer %s: broadcasting mode has no retries; message %s dropped", member.group, m.msg_id)
            return
        # Until the client closes, not while running: a batch failing as shutdown begins still goes
        # back. The offset stays held (in flight) until the broker has the message.
        copy = None
        while not member.closed:
            try:
                await member.client.request(RequestCode.CONSUMER_SEND_MSG_BACK, SendBackRequest(
                    member.group, m.msg_id, q.topic, m.reconsume_times, self.max_reconsume_times, copy))
                self.retrying.succeeded()
                return
            except ClientError as e:
                member.stats.send_back_errors += 1
                if isinstance(e, BrokerError) and e.code == ResponseCode.QUERY_NOT_FOUND and copy is None:
                    # the broker no longer holds it (retention deleted it meanwhile): send our copy
                    copy = Message(q.topic, m.body, m.tags, m.keys, dict(m.properties))
                    continue
                await asyncio.sleep(self.retrying.failed(e))


class ConcurrentConsumption:
    def __init__(self, member: Member, listener: Listener, send_back: SendBack, threads: int, batch_max: int):
        self.member = member
        self.listener = listener
        self.send_back = send_back
        self.batch_max = batch_max
        # The pull loops wait for a free slot, so no more batches are pulled than the pool can run.
        self._slots = asyncio.Semaphore(threads)
        self._consuming: set[asyncio.Task] = set()  # batches handed to the listener

    async def hand_over(self, q: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Starts the listener on each batch of `msgs`; their offsets are in flight until it is done.
        The pull goes on after them (None)."""
        for i in range(0, len(msgs), self.batch_max):
            batch = msgs[i:i + self.batch_max]
            q.in_flight.update(m.queue_offset for m in batch)
            await self._slots.acquire()
            task = asyncio.ensure_future(self._consume(q, batch))
            self._consuming.add(task)
            task.add_done_callback(self._consuming.discard)

    async def wait(self, timeout: float) -> None:
        """For shutdown: a batch the listener fails now must still go back to the broker before the
        last commit moves past it; one still running when the wait ends keeps its offset held."""
        if self._consuming:
            await asyncio.wait(set(self._consuming), timeout=timeout)

    async def _consume(self, q: ProcessQueue, msgs: list[MessageExt]) -> None:
        try:
            try:
                status = await self.listener(msgs, ConsumeContext(q.topic, q.queue_id))
            except Exception:
                log.exception("consumer %s: listener raised; messages will be consumed again later", self.member.group)
                status = ConsumeStatus.RECONSUME_LATER
            if status is not ConsumeStatus.CONSUME_SUCCESS:
                for m in msgs:
                    await self.send_back(q, m)
        finally:
            self._slots.release()
            q.in_flight.difference_update(m.queue_offset for m in msgs)


class OrderlyConsumption:
    def __init__(self, member: Member, listener: Listener, locks: QueueLocks, offsets: OffsetStore, batch_max: int,
                 suspend_s: float):
        self.member = member
        self.listener = listener
        self.locks = locks
        self.offsets = offsets
        self.batch_max = batch_max
        self.suspend_s = suspend_s

    async def hand_over(self, q: ProcessQueue, msgs: list[MessageExt]) -> int | None:
        """Consumes `msgs` batch by batch, each until the listener succeeds, while this member holds
        the queue's lock; commits how far it got. Returns the offset to pull from again if it stopped
        before the end (the lock lost), else None."""
        i = 0
        while i < len(msgs):
            if not self.member.running or q.stopped or not await self.locks.hold(q):
                return msgs[i].queue_offset  # the first unconsumed one
            batch = msgs[i:i + self.batch_max]
            q.in_flight.update(m.queue_offset for m in batch)
            try:
                status = await self.listener(batch, ConsumeContext(q.topic, q.queue_id))
            except Exception:
                log.exception("consumer %s: orderly listener raised; suspending the queue", self.member.group)
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
        await self.offsets.commit([q])
        return None

    async def wait(self, timeout: float) -> None:
        """Nothing to wait for: a queue's batches run inside its pull loop, which shutdown has stopped."""
