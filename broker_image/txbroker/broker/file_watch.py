"""Noticing that a file changed: for credentials and TLS certificates mounted from Kubernetes Secrets.

Kubernetes updates a Secret volume by writing a new directory and swapping the `..data` symlink,
so the file's own mtime may not move; stat() follows the symlinks, and the inode, size or mtime of
what the path resolves to changes. Polling once a second is cheap and needs no inotify.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable

from txbroker.lifecycle import stop_task

log = logging.getLogger(__name__)


def _signature(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None  # missing for a moment during a swap: wait for it to come back
    return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns


class FileWatcher:
    def __init__(self, paths: list[str], on_change: Callable[[], None], interval: float = 1.0):
        self.paths = [p for p in paths if p]
        self._on_change = on_change
        self._interval = interval
        self._seen = {p: _signature(p) for p in self.paths}
        self._task: asyncio.Task | None = None
        self._running = False

    def changed(self) -> bool:
        """Whether any file changed since the last call (a missing file is not a change)."""
        changed = False
        for p in self.paths:
            sig = _signature(p)
            if sig is not None and sig != self._seen.get(p):
                self._seen[p] = sig
                changed = True
        return changed

    def start(self) -> None:
        if self.paths and self._task is None:
            self._running = True
            self._task = asyncio.get_running_loop().create_task(self._run(), name="file-watch")

    async def stop(self) -> None:
        self._running = False
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        while self._running:
            await asyncio.sleep(self._interval)
            try:
                if self.changed():
                    self._on_change()
            except Exception:  # a failed reload must not end watching
                log.exception("reacting to a changed file failed")
