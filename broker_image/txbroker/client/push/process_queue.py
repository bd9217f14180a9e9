"""One queue this member consumes (RocketMQ's ProcessQueue): the state the rebalancer, the pull
loop, the consumers, the lock and the offset store share."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class ProcessQueue:
    """A queue this member consumes: where it is, and what is in flight."""

    topic: str
    queue_id: int
    next_pull: int
    in_flight: set[int] = field(default_factory=set)
    consumed_to: int = 0  # all before this are done
    committed: int = -1
    task: asyncio.Task | None = None  # its pull loop
    locked_until: float = 0.0
    stopped: bool = False  # dropped from this member: its loop must end

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.queue_id

    def done_offset(self) -> int:
        return min(self.in_flight) if self.in_flight else self.next_pull
