"""One data-plane connection: the asyncio glue between a transport and the dispatcher.

`data_received` only decodes frames and hands each to the dispatcher (dispatch.py: admission,
processors, errors to codes), which answers through `respond`; a frame that cannot be decoded
becomes an error answer, never an exception in the callback. Writes are batched per loop iteration
(protocol/batched.py, shared with the client). Flow control: the broker stops reading from a
connection that has too many requests in flight, or whose client is not reading its answers
(transport paused), so one slow client cannot make the broker buffer without bound or stall others.

With authentication on, the dispatcher admits every request but SASL_AUTHENTICATE first, and the
handlers check rights through `connection.access`. A refusal that ends the connection is answered
first and the connection closed a moment later ("lingering"), so the client reads the answer
instead of a reset. `sweep` closes connections that did not authenticate in time or sat idle.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from txbroker.broker.auth.acl import NO_ACCESS, OPEN_ACCESS
from txbroker.broker.dispatch import REQUEST_NAMES, Dispatcher
from txbroker.broker.limits import busy
from txbroker.broker.replies import Reply
from txbroker.protocol.batched import OUTPUT_HIGH_WATER, BatchedProtocol
from txbroker.protocol.bodies import ErrorBody, encode
from txbroker.protocol.codes import ResponseCode, code_name
from txbroker.protocol.framing import FLAG_ONEWAY, FLAG_RESPONSE, Frame, FrameDecoder, FrameError, encode_frame

log = logging.getLogger(__name__)

LINGER_SECONDS = 1.0  # how long a refused connection stays open for its answer to be read


class BrokerConnection(BatchedProtocol):
    def __init__(self, broker):
        super().__init__()
        self._broker = broker
        self._metrics = broker.metrics
        self._dispatch = Dispatcher(broker).dispatch
        if broker.idle_poll is not None:  # (set at the broker's start: protocol/idle_poll.py)
            self._touch = broker.idle_poll.touch
        self._decoder = FrameDecoder(broker.config.max_frame_size)
        self._max_inflight = broker.config.max_inflight_per_connection
        self._inflight = 0
        self._held = 0  # bytes of this connection's requests in flight
        self._reading_paused = False
        self._closing = False
        # Frames decoded but not dispatched yet because the connection must wait (too much in
        # flight, answers not being read): at most one read's worth, as reading pauses at once.
        self._backlog: collections.deque = collections.deque()
        self._running = False  # inside _run: do not start another
        self.peer = "?"
        self.client_id = ""
        # security and limits
        self._auth = broker.auth  # AuthService, or None when authentication is off
        self.access = OPEN_ACCESS if self._auth is None else NO_ACCESS  # what handlers check rights on
        self.principal = None  # whom the connection authenticated as
        self.sasl = None  # a SCRAM exchange in progress
        self._counted = False  # in broker.connections (a connection refused at once is not)
        self._lingering = False  # answered a refusal: ignore input until closed
        self.active = True  # received something since the last idle sweep
        self.opened_at = 0.0
        self.idle_since = 0.0
        self.replica = False  # a slave's replication connection: exempt from idle expiry
        self.tls = False

    # ---- asyncio callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        self.tls = transport.get_extra_info("sslcontext") is not None
        self.opened_at = self.idle_since = self._loop.time()
        limit = self._broker.config.max_connections
        if len(self._broker.connections) >= limit:
            self._metrics.limit_refusals.labels("max_connections").inc()
            log.warning("refusing a connection from %s: max_connections (%d) reached", self.peer, limit)
            self.refuse(busy("max_connections", f"this broker has {limit} connections open, its maximum"))
            return
        self._counted = True
        self._broker.connections.add(self)
        self._metrics.connections.inc()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        super().connection_lost(exc)
        if not self._counted:
            return
        self._broker.connections.discard(self)
        self._broker.producers.remove(self)
        self._broker.leader.remove(self)
        self._broker.consumers.remove_connection(self)
        self._metrics.connections.dec()
        # requests still in flight give their bytes back as they finish (the dispatcher)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._update_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._update_reading()
        self._resume_backlog()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        if self._touch is not None:
            self._touch()
        self.active = True
        items = self._decoder.feed(data)
        if self._backlog:
            self._backlog.extend(items)
            self._update_reading()
            return
        self._run(items)

    def _must_wait(self) -> bool:
        return (self._writing_paused or self._inflight >= self._max_inflight
                or self._out_bytes >= OUTPUT_HIGH_WATER)

    def _run(self, items) -> None:
        """Dispatch frames until the connection must wait; keep the rest for later."""
        self._running = True
        dispatch = self._dispatch
        try:
            for i, item in enumerate(items):
                if self._closing:  # also after a refusal (lingering): nothing more is processed
                    return
                if self._must_wait():
                    self._backlog.extend(items[i:])
                    self._update_reading()
                    return
                if type(item) is Frame:
                    dispatch(self, item)
                else:
                    self._frame_error(item)
        finally:
            self._running = False

    def _resume_backlog(self) -> None:
        if self._backlog and not self._running and not self._must_wait() and not self._closing:
            items = list(self._backlog)
            self._backlog.clear()
            self._run(items)
            self._update_reading()

    def _batch_flushed(self) -> None:
        # dispatch may go on unless the transport is now above its own high-water mark
        self._resume_backlog()
        self._update_reading()

    def _frame_error(self, err: FrameError) -> None:
        log.warning("bad frame from %s: %s%s", self.peer, err.reason, " (closing)" if err.fatal else "")
        if not err.fatal:  # the only recoverable frame error: larger than max_frame_size
            self._metrics.limit_refusals.labels("max_frame_size").inc()
        self._metrics.requests_rejected.labels("MESSAGE_ILLEGAL").inc()
        if self._closing:
            return
        self._write(encode_frame(FLAG_RESPONSE, ResponseCode.MESSAGE_ILLEGAL, err.opaque,
                                 encode(ErrorBody(err.reason))))
        if err.fatal:
            self._closing = True
            self._flush_out()
            self.transport.close()  # flushes what was written first

    # ---- the dispatcher's side: answers, and requests in flight --------------------------------

    def respond(self, frame: Frame, reply: Reply, started: float, flush: bool = True) -> bool:
        """Answer `frame` with `reply`; `started` (perf_counter, 0.0: not timed) gives its latency.
        `flush` False: the caller calls `flush_now` if this returns True (BatchedProtocol._write)."""
        if started:
            self._metrics.latency(REQUEST_NAMES.get(frame.code, "UNKNOWN")).observe(time.perf_counter() - started)
        if reply.code:
            self._metrics.requests_rejected.labels(code_name(reply.code)).inc()
        if frame.flags & FLAG_ONEWAY or self._closing:
            if reply.close:
                self.close()
            return False
        if reply.code == ResponseCode.SUCCESS:
            body = encode(reply.body) if reply.body is not None else b""
        else:
            body = encode(ErrorBody(reply.remark))
        first = self._write(encode_frame(FLAG_RESPONSE, reply.code, frame.opaque, body), flush)
        if reply.close:
            self._linger()
        return first

    def hold(self, size: int) -> None:
        """A request of `size` bytes waits (for a coroutine, or durability): it counts as in flight."""
        self._inflight += 1
        self._held += size
        if self._inflight >= self._max_inflight and not self._reading_paused:  # (only this can newly pause)
            self._update_reading()

    def release(self, size: int, resume_now: bool = True) -> None:
        """A request counted by `hold` finished: reading, and what waited, may go on (with
        `resume_now` False, what waited is dispatched in the next loop iteration)."""
        self._inflight -= 1
        self._held -= size
        if self._reading_paused:  # (a release never pauses reading, it may resume it)
            self._update_reading()
        if self._backlog:
            if resume_now:
                self._resume_backlog()
            else:
                self._loop.call_soon(self._resume_backlog)

    def _update_reading(self) -> None:
        should_pause = self._must_wait() or bool(self._backlog)
        if should_pause != self._reading_paused and not self._closing:
            self._reading_paused = should_pause
            if should_pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # ---- broker-initiated requests (check-back) ------------------------------------------------

    def writable(self) -> bool:
        """Whether broker-initiated frames (check-backs, notifications, replication) may go here:
        the client reads its answers, and its credentials (if any are required) are still valid."""
        return (not self._writing_paused and not self._closing
                and (self._auth is None or self._auth.valid(self.principal)))

    def send_oneway(self, code: int, body) -> None:
        if not self._closing:
            self._write(encode_frame(FLAG_ONEWAY, code, 0, encode(body)))

    def close(self) -> None:
        if self.transport is not None and not self._closing:
            self._closing = True
            self.transport.close()

    # ---- security and limits -------------------------------------------------------------------

    def authenticated(self, principal) -> None:
        """The connection acts as `principal` from now on (also: its permissions were reloaded)."""
        if self.principal is None:
            self._metrics.authentications.inc()
            log.info("connection from %s authenticated as %s", self.peer, principal.access_key)
        self.principal = principal
        self.access = principal
        self.sasl = None

    def refuse(self, reply: Reply) -> None:
        """Tell the client why the connection ends (a response with opaque 0: a connection-level
        answer, not tied to a request) and close it after the linger time. Nothing the client
        sends after this is processed."""
        if self.transport is None or self._closing:
            return
        self.transport.write(encode_frame(FLAG_RESPONSE, reply.code, 0, encode(ErrorBody(reply.remark))))
        self._linger()

    def _linger(self) -> None:
        self._lingering = True
        self._closing = True  # no further answers, check-backs or notifications
        self._flush_out()
        transport = self.transport
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:
                pass
        self._loop.call_later(LINGER_SECONDS, transport.close)

    def sweep(self, now: float, idle_timeout: float, auth_timeout: float) -> None:
        """Called about once a second: close a connection that has not authenticated in time, or
        that has been idle (nothing received, nothing in flight) for `idle_timeout` seconds."""
        if self._closing:
            return
        if self.active:
            self.active = False
            self.idle_since = now
        if self._auth is not None and self.principal is None and now - self.opened_at >= auth_timeout:
            self._metrics.connections_closed.labels("auth_timeout").inc()
            self._auth.failed("auth_timeout")
            log.info("closing connection from %s: not authenticated within %.1fs", self.peer, auth_timeout)
            self.refuse(Reply(ResponseCode.UNAUTHORIZED, None,
                              f"no authentication within auth_timeout_ms ({int(auth_timeout * 1000)}): closing"))
        elif (idle_timeout and not self.replica and not self._inflight
              and now - self.idle_since >= idle_timeout):
            self._metrics.connections_closed.labels("idle").inc()
            log.info("closing connection from %s: idle for %.1fs", self.peer, now - self.idle_since)
            # Said, and lingered on, so that a request crossing the close is known to the client
            # as not processed (it may send it again on a new connection).
            self.refuse(Reply(ResponseCode.SERVICE_NOT_AVAILABLE, None,
                              f"closing the connection: idle for more than idle_timeout_ms "
                              f"({int(idle_timeout * 1000)}); requests sent after this were not processed"))

    @property
    def quiet(self) -> bool:
        """No request in flight or waiting, and no answer queued to write."""
        return not self._inflight and not self._backlog and self._out is None

    def describe(self, now: float) -> dict:
        t = self.transport
        return {"peer": self.peer, "client_id": self.client_id, "tls": self.tls,
                "access_key": self.principal.access_key if self.principal is not None else None,
                "requests_in_flight": self._inflight, "bytes_in_flight": self._held,
                "write_buffer_bytes": t.get_write_buffer_size() if t is not None and not t.is_closing() else 0,
                "reading_paused": self._reading_paused, "peer_not_reading": self._writing_paused,
                "idle_seconds": 0.0 if self.active else round(now - self.idle_since, 3),
                "replica": self.replica}
