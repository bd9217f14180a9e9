"""Warnings that repeat (a broker refusing every request, a failover in progress) must not fill the
log: the first of a kind is logged, the rest are counted and summed up once a minute."""

from __future__ import annotations

import logging
import time


class RepeatedWarnings:
    def __init__(self, logger: logging.Logger, every: float = 60.0):
        self._log = logger
        self._every = every
        self._kinds: dict[str, list] = {}  # kind -> [first logged at, repeats since]

    def warning(self, kind: str, msg: str, *args) -> None:
        """Log `msg` if no warning of `kind` was logged in the last minute; else count it."""
        now = time.monotonic()
        seen = self._kinds.get(kind)
        if seen is None or now - seen[0] >= self._every:
            if seen is not None and seen[1]:
                self._log.warning("%s: %d more like it in the last %.0f s", kind, seen[1], now - seen[0])
            self._kinds[kind] = [now, 0]
            self._log.warning(msg, *args)
        else:
            seen[1] += 1
