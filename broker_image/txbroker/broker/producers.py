"""Which live connections belong to which producer group, to send check-backs to."""

from __future__ import annotations

import time
from typing import Protocol


class CheckTarget(Protocol):
    def writable(self) -> bool: ...
    def send_oneway(self, code: int, body) -> None: ...


class ProducerRegistry:
    def __init__(self, expiry_ms: int):
        self._expiry = expiry_ms / 1000
        self._groups: dict[str, dict[CheckTarget, float]] = {}
        self._cursor: dict[str, int] = {}

    def heartbeat(self, conn: CheckTarget, groups: list[str]) -> None:
        now = time.monotonic()
        for g in groups:
            self._groups.setdefault(g, {})[conn] = now

    def remove(self, conn: CheckTarget) -> None:
        for members in self._groups.values():
            members.pop(conn, None)

    def live(self, group: str) -> list[CheckTarget]:
        members = self._groups.get(group)
        if not members:
            return []
        cutoff = time.monotonic() - self._expiry
        for conn in [c for c, seen in members.items() if seen < cutoff]:
            del members[conn]
        return list(members)

    def pick(self, group: str, live: list[CheckTarget]) -> CheckTarget | None:
        """Round robin over the group's writable connections; a stalled one is passed over."""
        n = len(live)
        start = self._cursor.get(group, 0)
        for i in range(n):
            conn = live[(start + i) % n]
            if conn.writable():
                self._cursor[group] = start + i + 1
                return conn
        return None

    def counts(self) -> dict[str, int]:
        return {g: len(self.live(g)) for g in list(self._groups)}
