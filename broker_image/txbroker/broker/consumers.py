"""Consumer groups: who is in a group now, and queue locks for ordered consumption.

Membership comes from heartbeats and ends when the connection closes or the member stays silent
past `consumer_expiry_ms`. Every change is announced to the group's members (one-way
NOTIFY_CONSUMER_IDS_CHANGED) so they rebalance at once instead of at their next interval.

A queue lock gives one member of a group the right to consume a queue in order, for a lease the
holder renews; it passes to another member only when released or expired, never on a mere
disconnect (a member whose connection blipped may still be mid-message).
"""

from __future__ import annotations

import logging
import time

from txbroker.protocol.bodies import NotifyConsumersChanged
from txbroker.protocol.codes import RequestCode

log = logging.getLogger(__name__)


class ConsumerRegistry:
    def __init__(self, expiry_ms: int):
        self._expiry = expiry_ms / 1000
        self._groups: dict[str, dict[str, tuple[object, float]]] = {}
        self._locks: dict[tuple[str, str, int], tuple[str, float]] = {}

    def heartbeat(self, conn, client_id: str, groups: list[str]) -> None:
        now = time.monotonic()
        for g in groups:
            members = self._groups.setdefault(g, {})
            known = members.get(client_id)
            members[client_id] = (conn, now)
            if known is None or known[0] is not conn:
                log.info("consumer %s joined group %s (%d members)", client_id, g, len(members))
                self._notify(g)

    def remove_connection(self, conn) -> None:
        for g, members in self._groups.items():
            gone = [c for c, (cn, _) in members.items() if cn is conn]
            for c in gone:
                del members[c]
                log.info("consumer %s left group %s (connection closed)", c, g)
            if gone:
                self._notify(g)

    def expire(self) -> None:
        cutoff = time.monotonic() - self._expiry
        for g, members in self._groups.items():
            gone = [c for c, (_, seen) in members.items() if seen < cutoff]
            for c in gone:
                del members[c]
                log.warning("consumer %s of group %s expired (no heartbeat)", c, g)
            if gone:
                self._notify(g)

    def members(self, group: str) -> list[str]:
        return sorted(self._groups.get(group, {}))

    def groups(self) -> dict[str, list[str]]:
        return {g: sorted(m) for g, m in self._groups.items() if m}

    def _notify(self, group: str) -> None:
        body = NotifyConsumersChanged(group)
        for conn, _ in self._groups.get(group, {}).values():
            if conn.writable():
                conn.send_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, body)

    # ---- queue locks --------------------------------------------------------------------------

    def lock(self, group: str, client_id: str, topic: str, queue_ids: list[int], lease_ms: int) -> list[int]:
        now = time.monotonic()
        locked = []
        for q in queue_ids:
            key = (group, topic, q)
            holder = self._locks.get(key)
            if holder is None or holder[0] == client_id or holder[1] < now:
                self._locks[key] = (client_id, now + lease_ms / 1000)
                locked.append(q)
        return locked

    def unlock(self, group: str, client_id: str, topic: str, queue_ids: list[int]) -> None:
        for q in queue_ids:
            key = (group, topic, q)
            holder = self._locks.get(key)
            if holder is not None and holder[0] == client_id:
                del self._locks[key]
