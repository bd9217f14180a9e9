"""Waiting on a condition (never a fixed sleep): the one way every test waits, from a broker's log
offset to a pod's phase."""

from __future__ import annotations

import time
from typing import Any, Callable


class WaitTimedOut(AssertionError, TimeoutError):
    """The condition did not hold in time: a test failure, and a TimeoutError for the few callers
    that wait on purpose for something that may not come."""


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition",
               interval: float | None = None) -> Any:
    """Poll `predicate` until it returns something truthy, and return that. An exception it raises
    counts as not yet (a restarting broker, an API server warming up), except an AssertionError,
    which fails at once; after `timeout` s this fails
    naming `what`, the last value and the last error. Polls every `interval` s, or from 50 ms
    backing off to 0.5 s, so a quick condition is seen at once and a slow one costs little."""
    deadline = time.monotonic() + timeout
    pause = interval or 0.05
    last, last_exc = None, None
    while True:
        try:
            last = predicate()
            if last:
                return last
        except AssertionError:  # the predicate's own verdict: no point waiting (a broker that exited)
            raise
        except Exception as e:  # noqa: BLE001 - keep polling; report the last error
            last_exc = e
        if time.monotonic() > deadline:
            raise WaitTimedOut(f"timed out after {timeout}s waiting for {what} (last: {last!r})"
                               + (f"; last error: {last_exc!r}" if last_exc else ""))
        time.sleep(pause)
        if interval is None:
            pause = min(pause * 1.5, 0.5)
