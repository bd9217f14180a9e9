"""Back-off and logging for a request retried until it works (a queue's loop, a send-back)."""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


class Retrying:
    """A broker refusing every request must not fill the log: one warning when the failures start,
    then a count every `report_every` seconds, and one when it works again."""

    def __init__(self, what: str, first_delay: float = 0.5, max_delay: float = 10.0, report_every: float = 60.0):
        self.what = what
        self.first_delay, self.max_delay, self.report_every = first_delay, max_delay, report_every
        self.failures = 0  # in a row
        self._unreported = 0
        self._reported_at = 0.0

    def failed(self, error: Exception) -> float:
        """Count and perhaps log a failure; returns the pause before the next try."""
        self.failures += 1
        now = time.monotonic()
        if self.failures == 1:
            log.warning("%s failed: %s; retrying", self.what, error)
            self._reported_at, self._unreported = now, 0
        else:
            self._unreported += 1
            if now - self._reported_at >= self.report_every:
                log.warning("%s failed %d more times in the last %.0f s (%d in a row); last: %s", self.what,
                            self._unreported, now - self._reported_at, self.failures, error)
                self._reported_at, self._unreported = now, 0
        return min(self.first_delay * 2 ** min(self.failures - 1, 16), self.max_delay)

    def succeeded(self) -> None:
        if self.failures:
            log.warning("%s works again after %d failures", self.what, self.failures)
            self.failures = 0
