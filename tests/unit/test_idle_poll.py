"""The event loop's poll before it sleeps (protocol/idle_poll.py): a read or write keeps the loop
polling for the window after the last one, then it sleeps; one poller a loop, the first caller
deciding its window; bad settings are refused naming the setting."""

from __future__ import annotations

import asyncio
import time

import pytest

from txbroker.broker.config import ConfigError, load_config
from txbroker.protocol import idle_poll



class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


async def _iterations(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
def free_core(monkeypatch):
    """Whether a core is free, as the poller sees it (the host's own load must not decide a test)."""
    state = {"free": True, "asked": 0}

    def core_free():
        state["asked"] += 1
        return state["free"]
    monkeypatch.setattr(idle_poll, "_core_free", core_free)
    return state


def test_the_loop_polls_for_the_window_after_the_last_touch_then_sleeps(monkeypatch, free_core):
    clock = Clock()
    monkeypatch.setattr(idle_poll, "_perf_counter", clock)

    async def main():
        poll = idle_poll.IdlePoll(asyncio.get_running_loop(), 1_000)  # 1 ms
        poll.touch()
        await _iterations()
        assert poll._polling
        clock.now += 0.0006
        poll.touch()  # a read 0.6 ms in: the window runs from the poll that sees it
        await _iterations()
        clock.now += 0.0009  # 1.5 ms after the first touch, 0.9 after the second
        await _iterations()
        assert poll._polling
        clock.now += 0.0002
        await _iterations()
        assert not poll._polling
        # only iterations with nothing read or written count (here: from the poll that saw the
        # second touch to the end; the clock stood still between the iterations before it)
        assert poll.polled_seconds == pytest.approx(0.0011)
        polled = poll.polled_seconds
        clock.now += 1.0
        await _iterations()
        assert not poll._polling and poll.polled_seconds == polled  # asleep: nothing more counted
    asyncio.run(main())


def test_while_polling_the_loop_never_blocks_in_its_selector(monkeypatch, free_core):
    """A loop polling goes round while it waits for a timer (its selector asked not to wait); one
    that sleeps goes round once, when the timer fires."""
    clock = Clock()
    monkeypatch.setattr(idle_poll, "_perf_counter", clock)

    async def main():
        poll = idle_poll.IdlePoll(asyncio.get_running_loop(), 1_000)
        polls = 0
        real = poll._poll

        def counted():
            nonlocal polls
            polls += 1
            real()
        poll._poll_cb = counted
        poll.touch()
        await asyncio.sleep(0.01)
        assert polls >= 2
        clock.now += 0.002
        await _iterations()
        assert not poll._polling
        after = polls
        await asyncio.sleep(0.01)
        assert polls == after
    asyncio.run(main())


def test_no_poll_while_the_cores_are_all_taken(monkeypatch, free_core):
    """Processes running outnumber the CPUs: no poll starts (and none is asked again for a moment),
    and one under way ends within CHECK_EVERY iterations of the cores filling up."""
    clock = Clock()
    monkeypatch.setattr(idle_poll, "_perf_counter", clock)

    async def main():
        poll = idle_poll.IdlePoll(asyncio.get_running_loop(), 1_000)
        free_core["free"] = False
        poll.touch()
        assert not poll._polling and free_core["asked"] == 1
        poll.touch()  # within BUSY_BACKOFF: not even asked
        assert not poll._polling and free_core["asked"] == 1
        clock.now += idle_poll.BUSY_BACKOFF
        free_core["free"] = True
        poll.touch()
        assert poll._polling and free_core["asked"] == 2
        await _iterations(3)
        free_core["free"] = False  # another process wants the CPU now
        await _iterations(idle_poll.CHECK_EVERY + 2)
        assert not poll._polling  # the window (the clock stood still) is not over: the load ended it
        poll.touch()
        assert not poll._polling  # backing off
    asyncio.run(main())


def test_one_poller_a_loop_and_the_first_caller_decides():
    async def main():
        loop = asyncio.get_running_loop()
        poll = idle_poll.for_loop(loop, 150)
        assert poll is not None and poll._window == pytest.approx(150e-6)
        assert idle_poll.for_loop(loop, 0) is poll  # a client on a broker's loop: the broker's setting holds
        assert idle_poll.for_loop(loop, 900) is poll and poll._window == pytest.approx(150e-6)
    asyncio.run(main())

    async def off():
        loop = asyncio.get_running_loop()
        assert idle_poll.for_loop(loop, 0) is None
        assert idle_poll.for_loop(loop, 200) is None  # the broker said 0: nothing on its loop polls
    asyncio.run(off())


def test_the_clients_window_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(idle_poll.CLIENT_ENV, raising=False)
    assert idle_poll.client_window_us() == idle_poll.CLIENT_DEFAULT_US == 200
    monkeypatch.setenv(idle_poll.CLIENT_ENV, "0")
    assert idle_poll.client_window_us() == 0
    monkeypatch.setenv(idle_poll.CLIENT_ENV, " 50 ")
    assert idle_poll.client_window_us() == 50
    for bad in ("fast", "1.5", "-1", str(idle_poll.MAX_WINDOW_US + 1)):
        monkeypatch.setenv(idle_poll.CLIENT_ENV, bad)
        with pytest.raises(ValueError, match=idle_poll.CLIENT_ENV):
            idle_poll.client_window_us()


def test_a_client_polls_only_while_few_of_its_requests_await_answers(monkeypatch, free_core):
    """A client's loop polls for a lone request's answer; with more than CLIENT_MAX_WAITING in
    flight, a read or write neither starts a poll nor extends one, which then ends with its window."""
    clock = Clock()
    monkeypatch.setattr(idle_poll, "_perf_counter", clock)

    async def main():
        poll = idle_poll.for_loop(asyncio.get_running_loop(), 1_000, idle_poll.CLIENT_MAX_WAITING)
        assert isinstance(poll, idle_poll.ClientPoll)
        poll.waiting = idle_poll.CLIENT_MAX_WAITING + 1
        poll.touch()
        assert not poll._polling
        poll.waiting = 1
        poll.touch()
        assert poll._polling
        await _iterations()
        poll.waiting = idle_poll.CLIENT_MAX_WAITING + 1  # a burst of requests: the poll is not extended
        clock.now += 0.0008
        poll.touch()
        await _iterations()
        assert poll._polling  # 0.8 ms into a 1 ms window
        clock.now += 0.0003
        poll.touch()
        await _iterations()
        assert not poll._polling
    asyncio.run(main())


def test_the_brokers_window_is_checked(tmp_path):
    base = {"data_dir": str(tmp_path)}
    assert load_config(None, base).idle_poll_us == 200
    assert load_config(None, {**base, "idle_poll_us": 0}).idle_poll_us == 0
    for bad in (-1, idle_poll.MAX_WINDOW_US + 1):
        with pytest.raises(ConfigError, match="idle_poll_us must be between 0"):
            load_config(None, {**base, "idle_poll_us": bad})
