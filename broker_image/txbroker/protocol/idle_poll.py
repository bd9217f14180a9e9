"""Polling a moment after the last read or write, before the event loop sleeps.

A loop that blocks in epoll the moment it has nothing to do is woken by the next request: the
kernel's wake-up, and on a virtual machine the vCPU's way out of its halt and back, cost more than
a small request does, and leave caches cold (bench/README.md, "2026-12-07: polling before the loop
sleeps": one producer's transactions, 2,400 a second with both sides sleeping, 3,500 with the
broker polling, 6,000 with its client polling too). So after each frame read or written, the loop
goes on polling, one iteration at a time with epoll asked not to wait, for `window` seconds; past
it, it blocks as before. Seastar (Redpanda, ScyllaDB) polls the same way before it sleeps, 200 us
by default (--idle-poll-time-us).

Polling only pays while a core is free. Each polling iteration yields the CPU (sched_yield), but a
yield does not lower a process's fair share: processes that poll while they outnumber the cores
take CPU from those with work (2 load processes of 16 producers each, polling beside the broker on
2 cores: 14,200 transactions a second sleeping, 10,800 polling). So a poll starts, and goes on
(looked at every CHECK_EVERY iterations), only while the processes running are no more than this
process's CPUs (/proc/loadavg); otherwise the loop sleeps, and asks again BUSY_BACKOFF later.

A client process polls only for the answer to a lone request (ClientPoll: no more than
CLIENT_MAX_WAITING of its requests waiting): a producer that waits for each answer is bound by the
round trip, and polling halves it; one with many requests in flight is woken by answers often
enough, and polling there took CPU from the broker (the 2 load processes above). Its window is
TXBROKER_IDLE_POLL_US, CLIENT_DEFAULT_US unless given; 0 sleeps at once.

One poller a loop, shared by every connection on it (the broker's, or the clients' of a process).
`touch` is on the read and write paths: it sets a flag, and arms the poll if it is not running.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref

DEFAULT_WINDOW_US = 200  # the broker's (idle_poll_us)
MAX_WINDOW_US = 1_000_000
# The clients' window, for every client on a loop: TXBROKER_IDLE_POLL_US, this unless given (0: sleep at once).
CLIENT_ENV = "TXBROKER_IDLE_POLL_US"
CLIENT_DEFAULT_US = 200
CLIENT_MAX_WAITING = 2  # a client's loop polls while no more of its requests than this await answers
CHECK_EVERY = 32  # polling iterations between looks at whether a core is still free
BUSY_BACKOFF = 0.001  # seconds before asking again once the cores were all taken

_perf_counter = time.perf_counter  # (a module global: the tests drive a clock of their own)
_sched_yield = getattr(os, "sched_yield", None) or (lambda: None)
try:
    _CPUS = len(os.sched_getaffinity(0))
except (AttributeError, OSError):
    _CPUS = os.cpu_count() or 1
_loadavg_fd: int | None = None


def _core_free() -> bool:
    """No more processes running than this process has CPUs, itself included (the fourth field of
    /proc/loadavg, "running/total"; one pread of a file kept open, under 2 us). True where there
    is no /proc."""
    global _loadavg_fd
    try:
        if _loadavg_fd is None:
            _loadavg_fd = os.open("/proc/loadavg", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        running = int(os.pread(_loadavg_fd, 128, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return True
    return running <= _CPUS


class IdlePoll:
    __slots__ = ("_loop", "_window", "_touched", "_polling", "_until", "_last", "_polls", "_busy_until",
                 "polled_seconds", "_poll_cb", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, window_us: int):
        self._loop = loop
        self._window = window_us / 1e6
        self._touched = False  # a read or write since the poll last looked
        self._polling = False
        self._until = 0.0  # polling ends here unless touched again
        self._last = 0.0  # when the poll last looked
        self._polls = 0
        self._busy_until = 0.0  # the cores were all taken: no poll starts before this
        self.polled_seconds = 0.0  # loop iterations with nothing read or written: what polling costs
        self._poll_cb = self._poll
        self.waiting = 0  # the clients' requests on this loop awaiting answers (client/connection.py counts)

    def touch(self) -> None:
        if self._polling:
            self._touched = True
            return
        now = _perf_counter()
        if now < self._busy_until:
            return
        if not _core_free():
            self._busy_until = now + BUSY_BACKOFF
            return
        self._polling = True
        self._last = now
        self._until = now + self._window
        self._loop.call_soon(self._poll_cb)

    def _poll(self) -> None:
        now = _perf_counter()
        if self._touched:
            self._touched = False
            self._until = now + self._window
        else:
            self.polled_seconds += now - self._last
        self._last = now
        self._polls += 1
        if now < self._until:
            if self._polls % CHECK_EVERY or _core_free():
                _sched_yield()
                self._loop.call_soon(self._poll_cb)
                return
            self._busy_until = now + BUSY_BACKOFF
        self._polling = False


class ClientPoll(IdlePoll):
    """A client process's poller: a read or write starts or extends the poll only while no more than
    `max_waiting` requests on the loop await their answers."""
    __slots__ = ("_max_waiting",)

    def __init__(self, loop: asyncio.AbstractEventLoop, window_us: int, max_waiting: int):
        super().__init__(loop, window_us)
        self._max_waiting = max_waiting

    def touch(self) -> None:
        if self.waiting <= self._max_waiting:
            IdlePoll.touch(self)


_BY_LOOP: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, IdlePoll | None]" = weakref.WeakKeyDictionary()


def for_loop(loop: asyncio.AbstractEventLoop, window_us: int, max_waiting: int | None = None) -> IdlePoll | None:
    """The loop's poller, None if its loop sleeps at once. The first call on a loop decides, for
    every connection on it: a broker's at its start (its idle_poll_us, also for the clients it runs,
    a slave's replication among them), a client process's from TXBROKER_IDLE_POLL_US (with
    `max_waiting`: a ClientPoll)."""
    try:
        return _BY_LOOP[loop]
    except KeyError:
        if window_us <= 0:
            poll = None
        elif max_waiting is None:
            poll = IdlePoll(loop, window_us)
        else:
            poll = ClientPoll(loop, window_us, max_waiting)
        _BY_LOOP[loop] = poll
        return poll


def client_window_us() -> int:
    """The clients' window: TXBROKER_IDLE_POLL_US, or CLIENT_DEFAULT_US. Raises ValueError naming
    the variable if it is not a whole number of microseconds between 0 and MAX_WINDOW_US."""
    text = os.environ.get(CLIENT_ENV, "").strip()
    if not text:
        return CLIENT_DEFAULT_US
    try:
        us = int(text)
    except ValueError:
        raise ValueError(f"{CLIENT_ENV} must be a whole number of microseconds (0: off), got {text!r}") from None
    if not 0 <= us <= MAX_WINDOW_US:
        raise ValueError(f"{CLIENT_ENV} must be between 0 (off) and {MAX_WINDOW_US}, got {us}")
    return us
