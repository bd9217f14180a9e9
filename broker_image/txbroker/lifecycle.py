"""Stopping background tasks reliably.

On Python 3.11 `asyncio.wait_for` can swallow a cancellation that arrives as its inner awaitable
completes (CPython gh-86296), so a loop that relies on cancellation alone may never end and whoever
awaits it hangs. Loops therefore also check a flag, and stopping waits a bounded time.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


async def stop_task(task: asyncio.Task | None, timeout: float = 5.0) -> None:
    """Cancel `task` (whose loop also checks its owner's stop flag) and wait for it, at most `timeout`."""
    if task is None or task.done():
        return
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        log.error("task %s did not stop within %.1fs; leaving it behind", task.get_name(), timeout)
        return
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s ended with an error", task.get_name(), exc_info=task.exception())
