"""A listening socket that accepts TLS only, and tells a plaintext client so instead of dropping it.

asyncio's own TLS server cannot answer a client that speaks plaintext: the handshake just fails
and the client sees a reset. Here each accepted socket's first byte is peeked (never consumed): a
TLS handshake record (0x16) goes to asyncio's TLS transport as usual; anything else goes to a
plane-specific refusal (a TLS_REQUIRED frame on the data plane, an HTTP 400 on the admin plane)
written in plaintext, before the socket is closed. Only accepting is done here; every byte after
the first belongs to the normal protocol objects.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Callable

from txbroker.protocol.bodies import ErrorBody, encode
from txbroker.protocol.codes import ResponseCode
from txbroker.protocol.framing import FLAG_RESPONSE, encode_frame

log = logging.getLogger(__name__)

# What a plaintext client of a TLS-only port is told: a connection-level frame (opaque 0) on the
# data plane, which the client library turns into TlsRequired; an HTTP 400 on the admin plane.
DATA_PLAINTEXT_ANSWER = encode_frame(FLAG_RESPONSE, ResponseCode.TLS_REQUIRED, 0, encode(ErrorBody(
    "this broker accepts TLS connections only: connect with TLS (client option tls=..., CLI --tls-ca)")))
_ADMIN_TEXT = b"this admin API accepts HTTPS only: use https:// URLs\n"
ADMIN_PLAINTEXT_ANSWER = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                          b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_ADMIN_TEXT), _ADMIN_TEXT))

TLS_HANDSHAKE_RECORD = 0x16
SNIFF_TIMEOUT = 10.0  # a client that connects and says nothing is dropped after this


class TlsOnlyListener:
    def __init__(self, host: str, port: int, protocol_factory: Callable[[], asyncio.BaseProtocol],
                 ssl_context: ssl.SSLContext, refusal_factory: Callable[[], asyncio.BaseProtocol],
                 on_handshake_failed: Callable[[BaseException], None] | None = None):
        self._factory = protocol_factory
        self._ssl = ssl_context
        self._refusal = refusal_factory
        self._on_failed = on_handshake_failed
        self._loop = asyncio.get_running_loop()
        self._pending: dict[socket.socket, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task] = set()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=1024, reuse_port=False)
        self._sock.setblocking(False)
        self._loop.add_reader(self._sock.fileno(), self._accept)

    @property
    def address(self) -> tuple[str, int]:
        return self._sock.getsockname()[:2]

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of file descriptors: try again on the next readiness
                log.error("accept failed: %s", e)
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._pending[conn] = self._loop.call_later(SNIFF_TIMEOUT, self._drop, conn)
            self._loop.add_reader(conn.fileno(), self._sniff, conn)

    def _drop(self, conn: socket.socket) -> None:
        if self._pending.pop(conn, None) is not None:
            self._loop.remove_reader(conn.fileno())
            conn.close()

    def _sniff(self, conn: socket.socket) -> None:
        try:
            first = conn.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            first = b""
        timer = self._pending.pop(conn, None)
        if timer is not None:
            timer.cancel()
        self._loop.remove_reader(conn.fileno())
        if not first:
            conn.close()
            return
        if first[0] == TLS_HANDSHAKE_RECORD:
            coro = self._loop.connect_accepted_socket(self._factory, conn, ssl=self._ssl,
                                                      ssl_handshake_timeout=SNIFF_TIMEOUT)
        else:
            coro = self._loop.connect_accepted_socket(self._refusal, conn)
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t, c=conn: self._handed_over(t, c))

    def _handed_over(self, task: asyncio.Task, conn: socket.socket) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            conn.close()
            return
        exc = task.exception()
        if exc is not None:
            log.info("TLS handshake failed: %s", exc)
            if self._on_failed is not None:
                self._on_failed(exc)
            conn.close()

    def close(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for conn, timer in list(self._pending.items()):
            timer.cancel()
            self._loop.remove_reader(conn.fileno())
            conn.close()
        self._pending.clear()
        for t in self._tasks:
            t.cancel()


class PlaintextRefusal(asyncio.Protocol):
    """Writes `message` at once, ignores what the client sends, and closes after `linger` seconds
    (closing at once with unread input would reset the connection and lose the message)."""

    def __init__(self, message: bytes, linger: float = 1.0, on_refused: Callable[[], None] | None = None):
        self._message = message
        self._linger = linger
        self._on_refused = on_refused

    def connection_made(self, transport) -> None:
        if self._on_refused is not None:
            self._on_refused()
        transport.write(self._message)
        try:
            transport.write_eof()
        except (NotImplementedError, OSError, RuntimeError):
            pass
        asyncio.get_running_loop().call_later(self._linger, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self):
        return False  # close now: the client has seen our answer and is done


def data_tls_listener(host: str, port: int, factory, ctx: ssl.SSLContext, metrics) -> TlsOnlyListener:
    return TlsOnlyListener(host, port, factory, ctx,
                           lambda: PlaintextRefusal(DATA_PLAINTEXT_ANSWER, on_refused=metrics.plaintext_refused
                                                    .labels("data").inc),
                           lambda e: metrics.tls_handshake_failures.labels("data").inc())


def admin_tls_listener(host: str, port: int, factory, ctx: ssl.SSLContext, metrics) -> TlsOnlyListener:
    return TlsOnlyListener(host, port, factory, ctx,
                           lambda: PlaintextRefusal(ADMIN_PLAINTEXT_ANSWER, on_refused=metrics.plaintext_refused
                                                    .labels("admin").inc),
                           lambda e: metrics.tls_handshake_failures.labels("admin").inc())
