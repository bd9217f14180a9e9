"""Where a group's consumed offsets are kept: on the broker (clustering, where members hand queues to
each other), or in a local file (broadcasting, where every member consumes every queue)."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from txbroker.protocol.bodies import CommitOffsetsRequest, QueueOffset
from txbroker.protocol.codes import RequestCode

if TYPE_CHECKING:
    from txbroker.client.push.member import Member
    from txbroker.client.push.process_queue import ProcessQueue


class OffsetStore:
    # Every queue's offset is saved again this often, changed or not (as RocketMQ's clients persist
    # all offsets each interval): a commit the broker acknowledged can still be lost with its master
    # under ASYNC replication, and the group's offset would otherwise stay behind until the next
    # message, which a drained group never gets.
    RESAVE_S = 10.0

    def __init__(self, orderly: bool):
        # Orderly consumption hands out one batch at a time and records how far it got; concurrent
        # batches end in any order, so only what precedes the oldest one still in flight is done.
        self.orderly = orderly
        self._resave_at = time.monotonic() + self.RESAVE_S

    def committed(self, topic: str, on_broker: dict[int, int]) -> dict[int, int]:
        """The committed offsets of `topic`'s queues; `on_broker` is what the broker has."""
        raise NotImplementedError

    async def save(self, changed: list[tuple[ProcessQueue, int]]) -> None:
        raise NotImplementedError

    async def commit(self, queues: list[ProcessQueue]) -> None:
        resave = time.monotonic() >= self._resave_at
        changed = []
        for q in queues:
            off = q.done_offset() if not self.orderly else q.consumed_to
            if off != q.committed or (resave and off >= 0):
                changed.append((q, off))
        if not changed:
            return
        await self.save(changed)
        if resave:
            self._resave_at = time.monotonic() + self.RESAVE_S
        for q, off in changed:
            q.committed = off


class BrokerOffsetStore(OffsetStore):
    def __init__(self, member: Member, orderly: bool):
        super().__init__(orderly)
        self.member = member

    def committed(self, topic: str, on_broker: dict[int, int]) -> dict[int, int]:
        return on_broker

    async def save(self, changed: list[tuple[ProcessQueue, int]]) -> None:
        # only_forward: a member that took a queue over from an older commit (a rebalance under way,
        # the other member still consuming) never moves the group back behind the other's progress
        await self.member.client.request(RequestCode.UPDATE_CONSUMER_OFFSET, CommitOffsetsRequest(
            self.member.group, [QueueOffset(q.topic, q.queue_id, off) for q, off in changed], only_forward=True))


class LocalOffsetStore(OffsetStore):
    """One JSON file per group, {topic: {queue_id: offset}}, replaced whole (written, synced, renamed)
    so a crash leaves the old file or the new one."""

    def __init__(self, path: str, orderly: bool):
        super().__init__(orderly)
        self.path = path

    def committed(self, topic: str, on_broker: dict[int, int]) -> dict[int, int]:
        return {int(q): o for q, o in self._load().get(topic, {}).items()}

    async def save(self, changed: list[tuple[ProcessQueue, int]]) -> None:
        doc = self._load()
        for q, off in changed:
            doc.setdefault(q.topic, {})[str(q.queue_id)] = off
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _load(self) -> dict:
        try:
            with open(self.path) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}
