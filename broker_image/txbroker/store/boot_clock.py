"""Elapsed time that no step of the wall clock changes: CLOCK_BOOTTIME, named by the boot it counts from.

Retention reads a record's age from the mark taken after it (store/derived/marks.py). Aged by the
wall clock, a mark stamped while the clock was set back looks old once the clock is right again, and
the records before it go early; a clock set ahead deletes early while it lasts. So each mark also
notes this clock, and on the same boot (any process of it: a restart, a slave seeded on the same
machine) its age is the time that really passed. Another boot's mark, or one copied from another
machine, has only its wall-clock stamp to go by.

Where the system has no boot id or no CLOCK_BOOTTIME, the process's monotonic clock stands in,
named after this process alone, so only its own marks are aged by it.
"""

from __future__ import annotations

import os
import time
import uuid

_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def _boot_id() -> str | None:
    """The kernel's boot id, and the time namespace if the system has them (a namespace may offset
    CLOCK_BOOTTIME: a container restored elsewhere, OCI timeOffsets)."""
    try:
        with open(_BOOT_ID_FILE) as f:
            bid = f.read().strip()
    except OSError:
        return None
    try:
        return f"{bid}/timens-{os.stat('/proc/self/ns/time').st_ino}" if bid else None
    except OSError:
        return bid or None


class BootClock:
    __slots__ = ("id", "_clock")

    def __init__(self, boot_id: str | None = None, clock=None):
        bid = boot_id or _boot_id()
        if clock is None:
            if bid is not None and hasattr(time, "CLOCK_BOOTTIME"):
                clock = lambda: time.clock_gettime(time.CLOCK_BOOTTIME)  # noqa: E731 - counts through suspend too
            else:
                bid, clock = f"process-{os.getpid()}-{uuid.uuid4().hex}", time.monotonic
        self.id = bid
        self._clock = clock

    def now_ms(self) -> int:
        return int(self._clock() * 1000)
