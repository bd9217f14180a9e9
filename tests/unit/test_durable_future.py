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


def test_a_batch_cannot_be_cancelled_by_one_of_its_awaiters():
    """A batch is shared by every request in it and by internal awaiters (a job ending its members,
    an admin reply): cancelling one awaiter must not cancel the batch and answer the others as
    failed though their write went through. The awaiter is cancelled once the batch resolves."""
    events: list[str] = []

    async def go():
        loop = asyncio.get_running_loop()
        fut = DurableFuture(loop=loop)
        fut.waiting = ["request 1"]
        fut.on_resolved = lambda f: events.append(f"answered {f.waiting} ({state(f)})")
        awaiter = loop.create_task(_await(fut))
        await asyncio.sleep(0)                  # the awaiter is now waiting on the batch
        assert fut.cancel() is False
        awaiter.cancel()
        await asyncio.sleep(0)
        events.append(f"batch cancelled: {fut.cancelled()}, awaiter done: {awaiter.done()}")
        answer(fut)                             # the write went through
        with pytest.raises(asyncio.CancelledError):
            await awaiter
        events.append(f"awaiter cancelled: {awaiter.cancelled()}")

    asyncio.run(go())
    assert events == ["batch cancelled: False, awaiter done: False", "answered ['request 1'] (ok)",
                      "awaiter cancelled: True"]


async def _await(fut):
    await fut


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


class Conn:
    """What the dispatcher uses of a connection, recording its answers; `broken` fails on respond."""

    def __init__(self, name: str, broken: bool = False):
        self.peer, self.broken = name, broken
        self.released, self.queued, self.written = 0, [], []

    def hold(self, size):
        pass

    def release(self, size, resume_now=True):
        assert resume_now is False  # nothing is dispatched inside the resolving call
        self.released += size

    def respond(self, frame, reply, started, flush=True):
        if self.broken:
            raise RuntimeError("encoder broke")
        self.queued.append((frame.opaque, reply.code))
        return len(self.queued) == 1

    def flush_now(self):
        self.written.append(list(self.queued))
        self.queued.clear()


def test_the_dispatcher_answers_a_batch_held_requests_once_each_and_one_failing_leaves_the_rest_answered(caplog):
    from types import SimpleNamespace

    from txbroker.broker.dispatch import Dispatcher
    from txbroker.broker.replies import ok
    from txbroker.protocol.codes import RequestCode, ResponseCode
    from txbroker.protocol.framing import Frame

    async def go():
        budget = SimpleNamespace(used=0, limit=1 << 20)
        handlers = {RequestCode.END_TRANSACTION: lambda conn, body: ok(None, durable)}
        d = Dispatcher(SimpleNamespace(handlers=handlers, auth=None, unacked=budget, metrics=None,
                                       role=SimpleNamespace(gate=None)))
        durable = DurableFuture(loop=asyncio.get_running_loop())
        a, broken, b = Conn("a"), Conn("broken", broken=True), Conn("b")
        for i, conn in enumerate((a, broken, a, b), 1):
            d.dispatch(conn, Frame(0, RequestCode.END_TRANSACTION, i, b"xx"))
        assert budget.used == 8 and durable.waiting is not None
        answer(durable)
        assert budget.used == 0  # every request gave its bytes back, the broken one's too
        assert a.written == [[(1, ResponseCode.SUCCESS), (3, ResponseCode.SUCCESS)]]  # one write, both answers
        assert b.written == [[(4, ResponseCode.SUCCESS)]]
        assert durable.waiting is None

    asyncio.run(go())
    assert "answering END_TRANSACTION from broken failed" in caplog.text
