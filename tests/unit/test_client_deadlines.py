"""A connection's requests fail at their own deadlines, whatever order they were sent in and
however many answered requests came between (client/connection.py keeps the deadlines in one heap
with one timer, not a timer per request). Against a real socket: a server that answers only the
requests it is told to."""

from __future__ import annotations

import asyncio

import pytest

from txbroker.client.connection import Connection
from txbroker.client.errors import RequestTimeout
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.framing import FLAG_RESPONSE, FrameDecoder, encode_frame


class Server(asyncio.Protocol):
    """Answers a request whose body is b'answer', ignores the others."""

    def connection_made(self, transport):
        self.t, self.dec = transport, FrameDecoder(1 << 20)

    def data_received(self, data):
        for f in self.dec.feed(data):
            if f.body == b"answer":
                self.t.write(encode_frame(FLAG_RESPONSE, ResponseCode.SUCCESS, f.opaque, b"ok"))


async def _connected() -> tuple[Connection, asyncio.AbstractServer]:
    server = await asyncio.get_running_loop().create_server(Server, "127.0.0.1", 0)
    conn = Connection(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    await conn.open(5)
    return conn, server


def test_unanswered_requests_fail_at_their_own_deadlines_in_deadline_order():
    async def go():
        conn, server = await _connected()
        loop = asyncio.get_running_loop()
        failed: list[tuple[float, float]] = []   # (timeout, seconds it took)

        async def ask(timeout: float):
            t0 = loop.time()
            with pytest.raises(RequestTimeout, match="no answer within"):
                await conn.call(RequestCode.HEARTBEAT, b"silence", timeout)
            failed.append((timeout, loop.time() - t0))

        await asyncio.gather(ask(0.6), ask(0.2), ask(0.4))
        conn.close()
        server.close()
        return failed

    failed = asyncio.run(go())
    assert [t for t, _ in failed] == [0.2, 0.4, 0.6]
    assert all(took >= timeout for timeout, took in failed), failed   # never before its deadline


def test_one_unanswered_request_among_many_answered_still_fails_and_the_answered_succeed():
    async def go():
        conn, server = await _connected()
        silent = asyncio.ensure_future(conn.call(RequestCode.HEARTBEAT, b"silence", 0.5))
        answers = [await conn.call(RequestCode.HEARTBEAT, b"answer", 5) for _ in range(300)]
        with pytest.raises(RequestTimeout):
            await silent
        after = await conn.call(RequestCode.HEARTBEAT, b"answer", 5)   # the connection goes on
        kept = len(conn._deadlines)
        conn.close()
        server.close()
        return answers, after, kept

    answers, after, kept = asyncio.run(go())
    assert [a.body for a in answers] == [b"ok"] * 300 and after.body == b"ok"
    assert kept < 100   # answered requests' deadlines do not pile up over a long-lived connection
