"""A BrokerClient's connecting task outlives the request that started it (it is shared, behind
asyncio.shield): when that request gives up and the client is then closed, the task's ending
("client is closed") is nobody's to await, and must not surface as asyncio's "Task exception was
never retrieved" in the application's log."""

from __future__ import annotations

import asyncio
import gc
import socket

import pytest

from txbroker.client.connection import BrokerClient


def _refusing_address() -> str:
    with socket.socket() as s:   # bound and closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_connecting_task_left_behind_by_a_closed_client_ends_quietly():
    unhandled: list[str] = []

    async def go():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: unhandled.append(ctx.get("message", "")))
        client = BrokerClient(_refusing_address(), connect_timeout=0.2)
        with pytest.raises(asyncio.TimeoutError):   # the request gives up; connecting goes on
            await asyncio.wait_for(client.connection(loop.time() + 30), 0.05)
        connecting = client._connecting
        await client.close()
        await asyncio.wait((connecting,))           # ended, its exception not looked at here
        assert connecting.done() and not connecting.cancelled()
        del connecting
        client._connecting = None
        gc.collect()                                # a task's unretrieved exception is reported when it is freed

    asyncio.run(go())
    assert unhandled == []
