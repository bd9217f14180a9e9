"""One data-plane connection: framing in, dispatch, answers out, with flow control.

`data_received` only decodes frames and hands each to its processor; a frame that cannot be
decoded becomes an error answer, never an exception in the callback. Flow control: the broker
stops reading from a connection that has too many requests in flight, or whose client is not
reading its answers (transport paused), so one slow client cannot make the broker buffer
without bound or stall others.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time

import msgspec

from txbroker.broker.replies import Reply, RequestError
from txbroker.protocol.bodies import ErrorBody, encode
from txbroker.protocol.codes import RequestCode, ResponseCode, code_name
from txbroker.protocol.framing import FLAG_ONEWAY, FLAG_RESPONSE, Frame, FrameDecoder, FrameError, encode_frame

log = logging.getLogger(__name__)

_REQUEST_NAMES = {c.value: c.name for c in RequestCode}


class BrokerConnection(asyncio.Protocol):
    def __init__(self, broker):
        self._broker = broker
        self._handlers = broker.handlers
        self._metrics = broker.metrics
        self._decoder = FrameDecoder(broker.config.max_frame_size)
        self._max_inflight = broker.config.max_inflight_per_connection
        self._inflight = 0
        self._reading_paused = False
        self._writing_paused = False
        self._closing = False
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] | None = None  # frames to write at the end of this loop iteration
        self._writable = asyncio.Event()
        self._writable.set()
        self.peer = "?"
        self.client_id = ""

    # ---- asyncio callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        self._broker.connections.add(self)
        self._metrics.connections.inc()

    def connection_lost(self, exc: Exception | None) -> None:
        self._broker.connections.discard(self)
        self._broker.producers.remove(self)
        self._broker.leader.remove(self)
        self._broker.consumers.remove_connection(self)
        self._metrics.connections.dec()
        self._closing = True
        self._writable.set()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._writable.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._writable.set()
        self._update_reading()

    async def drained(self) -> None:
        """Wait until the peer has taken what was written (or the connection is gone)."""
        await self._writable.wait()

    def data_received(self, data: bytes) -> None:
        for item in self._decoder.feed(data):
            if type(item) is Frame:
                self._dispatch(item)
            else:
                self._frame_error(item)

    # ---- requests ---------------------------------------------------------------------------

    def _dispatch(self, frame: Frame) -> None:
        if frame.flags & FLAG_RESPONSE:
            return  # check-backs are one-way: nothing to match an answer to
        handler = self._handlers.get(frame.code)
        if handler is None:
            self._respond(frame, Reply(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, None,
                                       f"request code {frame.code} is not supported"), 0.0)
            return
        started = time.perf_counter()
        try:
            reply = handler(self, frame.body)
        except Exception as e:  # noqa: BLE001 - every failure becomes an answer, see _failure
            reply = self._failure(frame, e)
        if reply is None:  # a one-way request handled in full
            return
        if inspect.isawaitable(reply):
            self._track(+1)
            task = asyncio.ensure_future(reply)
            task.add_done_callback(lambda t, f=frame, s=started: self._async_done(f, t, s))
            return
        durable = reply.durable
        if durable is not None and not durable.done():
            self._track(+1)
            durable.add_done_callback(lambda d, f=frame, r=reply, s=started: self._durable_done(f, r, d, s))
            return
        self._respond(frame, reply, started)

    def _durable_done(self, frame: Frame, reply: Reply, durable: asyncio.Future, started: float) -> None:
        self._track(-1)
        err = None if durable.cancelled() else durable.exception()
        if isinstance(err, RequestError):  # e.g. FLUSH_SLAVE_TIMEOUT: stored, but not as promised
            reply = Reply(err.code, None, err.remark)
        elif durable.cancelled() or err is not None:
            reply = Reply(ResponseCode.SYSTEM_ERROR, None, "the broker could not store the request; it is restarting")
        self._respond(frame, reply, started)

    def _async_done(self, frame: Frame, task: asyncio.Task, started: float) -> None:
        self._track(-1)
        if task.cancelled():
            return
        exc = task.exception()
        reply = self._failure(frame, exc) if exc is not None else task.result()
        self._respond(frame, reply, started)

    def _failure(self, frame: Frame, e: BaseException) -> Reply:
        name = _REQUEST_NAMES.get(frame.code, str(frame.code))
        if isinstance(e, RequestError):
            return Reply(e.code, None, e.remark)
        if isinstance(e, (msgspec.DecodeError, msgspec.ValidationError)):
            return Reply(ResponseCode.MESSAGE_ILLEGAL, None, f"malformed {name} request body: {e}")
        log.exception("%s from %s failed", name, self.peer)
        return Reply(ResponseCode.SYSTEM_ERROR, None, f"{name} failed on the broker: {type(e).__name__}: {e}")

    def _respond(self, frame: Frame, reply: Reply, started: float) -> None:
        if started:
            self._metrics.latency(_REQUEST_NAMES.get(frame.code, "UNKNOWN")).observe(time.perf_counter() - started)
        if reply.code:
            self._metrics.requests_rejected.labels(code_name(reply.code)).inc()
        if frame.flags & FLAG_ONEWAY or self._closing:
            return
        if reply.code == ResponseCode.SUCCESS:
            body = encode(reply.body) if reply.body is not None else b""
        else:
            body = encode(ErrorBody(reply.remark))
        self._write(encode_frame(FLAG_RESPONSE, reply.code, frame.opaque, body))

    def _write(self, data: bytes) -> None:
        """Queue a frame; all frames of one loop iteration go out in one system call (a group
        commit completes many requests at once, and a send syscall costs more than the rest)."""
        out = self._out
        if out is None:
            self._out = [data]
            asyncio.get_running_loop().call_soon(self._flush_out)
        else:
            out.append(data)

    def _flush_out(self) -> None:
        out, self._out = self._out, None
        if out and not self.transport.is_closing():
            if len(out) == 1:
                self.transport.write(out[0])
            else:
                self.transport.writelines(out)

    def _frame_error(self, err: FrameError) -> None:
        log.warning("bad frame from %s: %s%s", self.peer, err.reason, " (closing)" if err.fatal else "")
        self._metrics.requests_rejected.labels("MESSAGE_ILLEGAL").inc()
        if self._closing:
            return
        self._write(encode_frame(FLAG_RESPONSE, ResponseCode.MESSAGE_ILLEGAL, err.opaque,
                                 encode(ErrorBody(err.reason))))
        if err.fatal:
            self._closing = True
            self._flush_out()
            self.transport.close()  # flushes what was written first

    # ---- flow control ------------------------------------------------------------------------

    def _track(self, delta: int) -> None:
        self._inflight += delta
        self._update_reading()

    def _update_reading(self) -> None:
        should_pause = self._writing_paused or self._inflight >= self._max_inflight
        if should_pause != self._reading_paused and not self._closing:
            self._reading_paused = should_pause
            if should_pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # ---- broker-initiated requests (check-back) ------------------------------------------------

    def writable(self) -> bool:
        return not self._writing_paused and not self._closing

    def send_oneway(self, code: int, body) -> None:
        if not self._closing:
            self._write(encode_frame(FLAG_ONEWAY, code, 0, encode(body)))

    def close(self) -> None:
        if self.transport is not None and not self._closing:
            self._closing = True
            self.transport.close()
