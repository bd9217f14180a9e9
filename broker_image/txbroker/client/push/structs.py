"""What a push consumer's user sees: the listener's answers and context, the options' values, the
counters."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


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
class ConsumeContext:
    topic: str
    queue_id: int


@dataclass
class ConsumerStats:
    """Counters a user can read: the client has no metrics registry of its own."""

    queue_errors: int = 0  # failed requests of a queue's loop (pull, offset commit, ...), each retried
    send_back_errors: int = 0  # failed send-backs of messages the listener did not consume, each retried
    # messages retention deleted before this member consumed them (its queues' offsets fell behind
    # the first stored message): the group never sees them, as Kafka's consumers past log.retention
    skipped_by_retention: int = 0
    # (topic, queue id, first skipped offset, first offset after) of the latest such skips (at most 100)
    skipped_ranges: list = field(default_factory=list)

    def skipped(self, topic: str, queue_id: int, start: int, end: int) -> None:
        self.skipped_by_retention += end - start
        self.skipped_ranges = [*self.skipped_ranges[-99:], (topic, queue_id, start, end)]
