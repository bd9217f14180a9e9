"""Orderly consumption's queue locks: one member at a time consumes a queue, under a lock the broker
holds for a lease and this member renews while it consumes."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from txbroker.client.errors import ClientError
from txbroker.protocol.bodies import LockQueuesRequest, LockQueuesResponse
from txbroker.protocol.codes import RequestCode

if TYPE_CHECKING:
    from txbroker.client.push.member import Member
    from txbroker.client.push.process_queue import ProcessQueue

log = logging.getLogger(__name__)


class QueueLocks:
    def __init__(self, member: Member, lease_ms: int):
        self.member = member
        self.lease_ms = lease_ms

    @property
    def retry_after(self) -> float:
        """How long a loop waits before asking again for a lock another member holds."""
        return min(self.lease_ms / 3000, 1.0)

    async def hold(self, q: ProcessQueue) -> bool:
        """Whether this member holds `q`'s lock, taking or renewing it when a third of the lease is gone."""
        now = time.monotonic()
        if q.locked_until - now > self.lease_ms / 1000 * 2 / 3:
            return True
        m = self.member
        try:
            r: LockQueuesResponse = await m.client.request(RequestCode.LOCK_BATCH_MQ, LockQueuesRequest(
                m.group, m.client_id, q.topic, [q.queue_id], self.lease_ms), LockQueuesResponse)
        except ClientError as e:
            log.warning("consumer %s: lock of %s:%d failed: %s", m.group, q.topic, q.queue_id, e)
            return q.locked_until > time.monotonic()
        if q.queue_id in r.locked:
            q.locked_until = now + self.lease_ms / 1000 * 0.9  # renew well before the broker's lease ends
            return True
        q.locked_until = 0.0
        return False

    async def release(self, q: ProcessQueue) -> None:
        """Best effort: a lock not released ends with its lease."""
        if not q.locked_until:
            return
        m = self.member
        try:
            await m.client.request(RequestCode.UNLOCK_BATCH_MQ, LockQueuesRequest(
                m.group, m.client_id, q.topic, [q.queue_id]), LockQueuesResponse, retry=False)
        except ClientError:
            pass
