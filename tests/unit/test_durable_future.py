"""A batch's future (store/group_commit.DurableFuture): the requests it holds are answered in the
call that resolves it, not a loop iteration later, whichever way it resolves, and only once; its
ordinary done-callbacks and awaiters see it as any future."""

from __future__ import annotations

import asyncio

import pytest

from txbroker.store.group_commit import DurableFuture, answer


def resolved_in_the_call(resolve) -> list[str]:
    """What happened, in order: `resolve(fut)` is called between 'before' and 'after'."""
    events: list[str] = []

    async def go():
        fut = DurableFuture(loop=asyncio.get_running_loop())
        fut.waiting = ["request 1", "request 2"]
        fut.on_resolved = lambda f: events.append(f"answered {f.waiting} ({state(f)})")
        fut.add_done_callback(lambda f: events.append("done-callback"))
        events.append("before")
        resolve(fut)
        events.append("after")
        await asyncio.sleep(0)
        resolve_again = fut.done()
        answer(fut)  # a second resolution does nothing
        await asyncio.sleep(0)
        events.append(f"done: {resolve_again}")

    asyncio.run(go())
    return events


def state(f: asyncio.Future) -> str:
    if f.cancelled():
        return "cancelled"
    return "failed" if f.exception() is not None else "ok"


def test_the_waiting_requests_are_answered_inside_set_result_and_the_callbacks_later():
    assert resolved_in_the_call(lambda f: f.set_result(None)) == [
        "before", "answered ['request 1', 'request 2'] (ok)", "after", "done-callback", "done: True"]


def test_a_failed_write_answers_them_too():
    assert resolved_in_the_call(lambda f: answer(f, RuntimeError("disk gone"))) == [
        "before", "answered ['request 1', 'request 2'] (failed)", "after", "done-callback", "done: True"]


def test_a_cancelled_future_answers_them_too():
    assert resolved_in_the_call(lambda f: f.cancel()) == [
        "before", "answered ['request 1', 'request 2'] (cancelled)", "after", "done-callback", "done: True"]


def test_it_is_awaited_like_any_future():
    async def go():
        fut = DurableFuture(loop=asyncio.get_running_loop())
        asyncio.get_running_loop().call_soon(answer, fut)
        await fut
        fut2 = DurableFuture(loop=asyncio.get_running_loop())
        asyncio.get_running_loop().call_soon(answer, fut2, ValueError("refused"))
        with pytest.raises(ValueError, match="refused"):
            await fut2
    asyncio.run(go())
