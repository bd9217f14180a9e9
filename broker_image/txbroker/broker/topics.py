"""Topic names, creation and queue selection; validating messages before they are stored."""

from __future__ import annotations

import itertools

from txbroker.protocol.bodies import Message
from txbroker.protocol.codes import ResponseCode
from txbroker.broker.replies import RequestError
from txbroker.store.records import TopicRecord
from txbroker.store.state import StateMachine
from txbroker.protocol.names import SCHEDULE_TOPIC, SYSTEM_TOPICS, TOPIC_NAME, TOPIC_NAME_RULE, TRANS_CHECK_MAX_TIME_TOPIC
MAX_QUEUES = 1024


def check_topic_name(name: str) -> None:
    if not TOPIC_NAME.match(name):
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                           f"invalid topic name {name!r}: use {TOPIC_NAME_RULE}")


class TopicRegistry:
    def __init__(self, state: StateMachine, auto_create: bool, default_queue_count: int, max_message_size: int,
                 delay_levels: int = 18, on_oversize=None):
        self._state = state
        self._delay_levels = delay_levels
        self.auto_create = auto_create
        self.default_queue_count = default_queue_count
        self.max_message_size = max_message_size
        self._round_robin: dict[str, itertools.count] = {}
        self._on_oversize = on_oversize  # metrics: a send refused by max_message_size

    def queue_count(self, topic: str) -> int | None:
        if topic == TRANS_CHECK_MAX_TIME_TOPIC:
            return 1
        if topic == SCHEDULE_TOPIC:
            return self._delay_levels
        return self._state.topics.get(topic)

    def require(self, topic: str, queue_id: int | None = None) -> int:
        """The topic's queue count; RequestError naming what is missing if the topic (or queue) is not there."""
        count = self.queue_count(topic)
        if count is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} does not exist")
        if queue_id is not None and not 0 <= queue_id < count:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"queue {queue_id} does not exist: topic {topic} has {count} queues")
        return count

    def create(self, name: str, queue_count: int = 0) -> bool:
        """Create (or widen) a topic; returns False if it already existed as asked."""
        check_topic_name(name)
        if name in SYSTEM_TOPICS:
            raise RequestError(ResponseCode.NO_PERMISSION, f"{name} is a system topic")
        queue_count = queue_count or self.default_queue_count
        if not 1 <= queue_count <= MAX_QUEUES:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"queue count must be between 1 and {MAX_QUEUES}, got {queue_count}")
        current = self._state.topics.get(name)
        if current is not None and current >= queue_count:
            return False
        self._state.append(TopicRecord(name, queue_count))
        return True

    def validate_for_send(self, messages: list[Message]) -> None:
        """Check each message and bind it to a queue. Messages without one (queue_id -1) go round
        robin per request: all of one request's messages to a topic share a queue, as a RocketMQ
        batch does, so they get consecutive offsets (one reservation and one run at commit) and
        a consumer reads them together. Raises RequestError."""
        if not messages:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "a send must carry at least one message")
        topics = self._state.topics
        limit = self.max_message_size
        total = 0
        chosen: dict[str, int] = {}
        for m in messages:
            topic = m.topic
            count = topics.get(topic)
            if count is None:
                count = self._missing_topic(topic)
            size = len(m.body)
            if size == 0:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"message to {topic} has an empty body")
            total += size
            if total > limit:
                if self._on_oversize is not None:
                    self._on_oversize()
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                                   f"message body of {size} bytes (request total {total}) exceeds max_message_size {limit}")
            q = m.queue_id
            if q == -1:
                q = chosen.get(topic)
                if q is None:
                    rr = self._round_robin.get(topic)
                    if rr is None:
                        rr = self._round_robin[topic] = itertools.count()
                    q = chosen[topic] = next(rr) % count
                m.queue_id = q
            elif not 0 <= q < count:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"queue {q} does not exist: topic {topic} has {count} queues")

    def _missing_topic(self, topic: str) -> int:
        check_topic_name(topic)
        if topic in SYSTEM_TOPICS:
            raise RequestError(ResponseCode.NO_PERMISSION, f"cannot send to system topic {topic}")
        if not self.auto_create:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} does not exist and auto_create_topic is off")
        self.create(topic)
        return self._state.topics[topic]
