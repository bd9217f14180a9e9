"""Broker-wide limits on what clients can make the broker hold, with the refusals they cause.

Per connection, flow control (connection.py) stops reading when too many requests are in flight or
the client does not read its answers: backpressure, not an error. Across connections:
  max_connections      a connection beyond it is told SYSTEM_BUSY (naming the limit) and closed;
  max_unacked_bytes    request bytes received and not yet answered (held for a durable write, a
                       slave's acknowledgement, a long poll). A request that would go beyond it is
                       answered SYSTEM_BUSY at once, unprocessed: the client may retry later;
  idle_timeout_ms      a connection with nothing received and nothing in flight for this long is
                       closed (0: never); replication connections are exempt;
  auth_timeout_ms      with authentication on, a connection must authenticate within this long.
"""

from __future__ import annotations

from txbroker.broker.replies import Reply
from txbroker.protocol.codes import ResponseCode


class UnackedBudget:
    """Bytes of requests in flight across all connections (connections add and subtract as their
    requests start and finish). A request always fits when nothing else is held (the limit is at
    least one frame), so a large message never waits forever."""

    __slots__ = ("limit", "used", "_gauge")

    def __init__(self, limit: int, gauge=None):
        self.limit = limit
        self.used = 0
        self._gauge = gauge

    def publish(self) -> None:
        """Set the gauge (from housekeeping, not per request)."""
        if self._gauge is not None:
            self._gauge.set(self.used)


def busy(limit: str, detail: str) -> Reply:
    return Reply(ResponseCode.SYSTEM_BUSY, None, f"{limit} reached: {detail}; retry later")
