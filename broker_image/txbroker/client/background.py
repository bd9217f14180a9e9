"""One event loop on a daemon thread, shared by the blocking client classes of a process."""

from __future__ import annotations

import asyncio
import threading

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            t = threading.Thread(target=_loop.run_forever, name="txbroker-client-loop", daemon=True)
            t.start()
        return _loop


def run(coro, timeout: float | None = None):
    """Run a coroutine on the background loop and wait for its result in this thread."""
    return asyncio.run_coroutine_threadsafe(coro, loop()).result(timeout)


class Blocking:
    """Base of a blocking client: its asyncio form (`_async`) runs on the background loop; start and
    shutdown (also as a `with` block) are its start() and close()."""

    _async = None

    def start(self):
        run(self._async.start())
        return self

    def shutdown(self) -> None:
        run(self._async.close())

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.shutdown()
