"""Plain (non-transactional) producers."""

from __future__ import annotations

import os
import uuid
import zlib
from dataclasses import dataclass, field

from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import BrokerError
from txbroker.protocol.bodies import (
    CreateTopicRequest, HeartbeatRequest, HeartbeatResponse, Message, RouteRequest, RouteResponse, SendRequest,
    SendResponse,
)
from txbroker.protocol.codes import RequestCode, ResponseCode


@dataclass
class SendResult:
    msg_ids: list[str]
    queue_ids: list[int] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)  # each message's broker group (a cluster's producers)

    @property
    def msg_id(self) -> str:
        return self.msg_ids[0]


def hash_selector(queue_count: int, msg: Message, arg) -> int:
    """RocketMQ's SelectMessageQueueByHash, with a hash that is the same in every process:
    messages with the same `arg` (or, without one, the same keys) go to the same queue."""
    key = str(arg if arg is not None else msg.keys)
    return zlib.crc32(key.encode()) % queue_count


def key_selector(queue_count: int, msg: Message, arg) -> int:
    """By the message's keys alone: for transactions, whose `arg` is the local transaction's, not a
    routing key. Messages with the same keys go to the same queue."""
    return zlib.crc32(msg.keys.encode()) % queue_count


def new_client_id() -> str:
    return f"{os.uname().nodename}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


def as_list(msg_or_msgs) -> list[Message]:
    msgs = [msg_or_msgs] if isinstance(msg_or_msgs, Message) else list(msg_or_msgs)
    if not msgs:
        raise ValueError("nothing to send: no messages given")
    for m in msgs:
        if not isinstance(m, Message):
            raise TypeError(f"expected txbroker.client.Message, got {type(m).__name__}")
        if m.transaction_id:  # set by an earlier transactional send: never put on the wire again
            m.transaction_id = ""
    return msgs


async def topic_queue_count(client: BrokerClient, topic: str) -> int:
    """How many queues `topic` has on the client's broker, creating it (as a send would) if missing."""
    try:
        r: RouteResponse = await client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, RouteRequest(topic), RouteResponse)
        return r.queue_count
    except BrokerError as e:
        if e.code != ResponseCode.TOPIC_NOT_EXIST:
            raise
    await client.request(RequestCode.UPDATE_AND_CREATE_TOPIC, CreateTopicRequest(topic))
    r = await client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, RouteRequest(topic), RouteResponse)
    return r.queue_count


class AsyncProducer:
    """Sends messages; a list sent at once is stored as one batch."""

    def __init__(self, group: str, brokers, *, request_timeout: float = 10.0, retry_sends: bool = False,
                 credentials=None, tls=None):
        self.group = group
        self.client_id = new_client_id()
        self.retry_sends = retry_sends  # a retried plain send can store a message twice
        # A plain producer does not register its group: registration is what brings a group's
        # check-backs, and with authentication on it needs the producer-group permission.
        self.client = BrokerClient(brokers, client_id=self.client_id, request_timeout=request_timeout,
                                   credentials=credentials, tls=tls)
        self._queue_counts: dict[str, int] = {}

    async def start(self) -> "AsyncProducer":
        await self.client.request(RequestCode.HEARTBEAT, HeartbeatRequest(self.client_id),
                                  HeartbeatResponse, retry=True)
        return self

    async def send(self, msg_or_msgs, selector=None, arg=None) -> SendResult:
        """Send; with `selector(queue_count, message, arg) -> queue_id` the messages go to that queue
        (ordered messages: related messages on one queue, e.g. `hash_selector` by key)."""
        msgs = as_list(msg_or_msgs)
        if selector is not None:
            for m in msgs:
                count = self._queue_counts.get(m.topic)
                if count is None:
                    count = self._queue_counts[m.topic] = await topic_queue_count(self.client, m.topic)
                m.queue_id = selector(count, m, arg)
        r: SendResponse = await self.client.request(RequestCode.SEND_MESSAGE, SendRequest(self.group, msgs),
                                                    SendResponse, retry=self.retry_sends)
        return SendResult(r.msg_ids, r.queue_ids, r.queue_offsets)

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()


class Producer(background.Blocking):
    """Blocking form of AsyncProducer."""

    def __init__(self, group: str, brokers, **kwargs):
        self._async = AsyncProducer(group, brokers, **kwargs)

    def send(self, msg_or_msgs, selector=None, arg=None) -> SendResult:
        return background.run(self._async.send(msg_or_msgs, selector, arg))
