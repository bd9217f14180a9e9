"""Waiting on a condition, for tests against processes and clusters (never a fixed sleep)."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll `predicate` until it returns something truthy; return that. Fail after `timeout` s,
    naming `what` and the last error the predicate raised."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - keep polling; report the last error
            last_exc = e
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}"
                               + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)
