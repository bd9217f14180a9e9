"""A persistent, pipelined connection to one broker, and a client over a list of brokers that
reconnects with backoff, authenticates each new connection (when given credentials) and speaks
TLS (when given a TlsConfig).

A response with opaque 0 is the broker speaking about the connection, not a request: why it is
being closed (too many connections, idle, not authenticated in time, TLS required). It is kept and
reported with the loss of the connection; the broker processes nothing it receives after it, so a
request still unanswered then was not processed and may be sent again."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import ssl
import time
from typing import Callable


from txbroker.client.errors import (
    BrokerError, BrokerUnavailable, ClientError, RequestTimeout, TlsHandshakeError, broker_error,
)
from txbroker.client.log_limit import RepeatedWarnings
from txbroker.client.security import as_credentials, as_tls, authenticate, tls_error
from txbroker.protocol import idle_poll
from txbroker.protocol.batched import BatchedProtocol
from txbroker.protocol.bodies import BODY_ERRORS, ErrorBody, HeartbeatRequest, HeartbeatResponse, decoder, encode
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.framing import FLAG_ONEWAY, Frame, FrameDecoder, FrameError, encode_frame

log = logging.getLogger(__name__)
_warnings = RepeatedWarnings(log)

MAX_FRAME = 64 * 1024 * 1024
_error_decoder = decoder(ErrorBody)


class ConnectionLost(Exception):
    """The connection ended. `refusal` is the broker's (code, remark) if it said why; `cause` the
    transport's error (an ssl.SSLError means TLS failed)."""

    def __init__(self, message: str, refusal: tuple[int, str] | None = None, cause: BaseException | None = None):
        super().__init__(message)
        self.refusal = refusal
        self.cause = cause

    def fatal(self, address: str, request: str = "connect") -> Exception | None:
        """The error to raise instead of reconnecting, if trying again cannot help."""
        if self.refusal is not None and self.refusal[0] in (ResponseCode.UNAUTHORIZED, ResponseCode.TLS_REQUIRED):
            return broker_error(address, request, *self.refusal)
        if isinstance(self.cause, ssl.SSLError):
            return tls_error(address, self.cause)
        return None


_REQUEST_NAMES = {c.value: c.name for c in RequestCode}


def _request_name(code: int) -> str:
    """A request code's name, for errors and logs (a dict, not the enum's lookup by value)."""
    return _REQUEST_NAMES.get(code) or str(code)


class _NoAnswer(Exception):
    """A request's answer did not come within its timeout (Connection.call turns it into RequestTimeout)."""


def _no_answer(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(_NoAnswer())


class Connection(BatchedProtocol):
    """One TCP connection, its own asyncio protocol. `call` pipelines: many requests may be in
    flight at once; those of one loop iteration leave in one write (BatchedProtocol)."""

    def __init__(self, address: str, on_request: Callable[[Frame], None] | None = None, *,
                 ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None):
        super().__init__()
        self.address = address
        self._on_request = on_request
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self._decoder = FrameDecoder(MAX_FRAME)
        self._waiting: dict[int, asyncio.Future] = {}
        # Requests' deadlines, (when, opaque, future), with one timer armed for the earliest: a
        # timer per request cost asyncio a TimerHandle, its cancel and heap churn in Python (about a
        # sixth of the client's instructions per transaction). Answered entries leave lazily.
        self._deadlines: list[tuple[float, int, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._ids = itertools.count(1)
        self.refusal: tuple[int, str] | None = None  # what the broker said when it closed the connection
        self.answered = False  # any response arrived (the connection worked at least once)
        self.closed = asyncio.Event()
        self._poll: idle_poll.IdlePoll | None = None  # the loop's poller: it counts the requests awaiting answers

    async def open(self, timeout: float) -> None:
        """Connect (and with TLS, handshake). Raises OSError, asyncio.TimeoutError, or
        TlsHandshakeError when the TLS handshake fails."""
        host, _, port = self.address.rpartition(":")
        host = host.strip("[]")
        loop = asyncio.get_running_loop()
        poll = self._poll = idle_poll.for_loop(loop, idle_poll.client_window_us(), idle_poll.CLIENT_MAX_WAITING)
        self._touch = poll.touch if poll is not None else None
        extra = {}
        if self._ssl is not None:
            extra = {"ssl": self._ssl, "server_hostname": self._server_hostname or host,
                     "ssl_handshake_timeout": max(timeout, 0.1)}
        try:
            await asyncio.wait_for(loop.create_connection(lambda: self, host, int(port), **extra), timeout)
        except ssl.SSLError as e:
            raise tls_error(self.address, e) from None

    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.closed.is_set()

    # ---- asyncio callbacks (connection_made: BatchedProtocol) -----------------------------------

    def data_received(self, data: bytes) -> None:
        if self._touch is not None:
            self._touch()
        for item in self._decoder.feed(data):
            if type(item) is FrameError:
                log.error("bad frame from %s: %s", self.address, item.reason)
                self.transport.close()
                return
            self._frame(item)

    def connection_lost(self, exc) -> None:
        super().connection_lost(exc)
        self._lost(exc)

    def _frame(self, frame: Frame) -> None:
        if frame.is_response:
            self.answered = True
            if frame.opaque == 0 and frame.code != ResponseCode.SUCCESS:
                self.refusal = (frame.code, _remark(frame))
                log.warning("broker %s is closing the connection: %s", self.address, self.refusal[1])
                self.close()
                return
            fut = self._waiting.pop(frame.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(frame)
        elif self._on_request is not None:
            self._on_request(frame)

    def _lost(self, exc) -> None:
        self.closed.set()
        why = f": {self.refusal[1]}" if self.refusal else (f": {exc}" if exc else "")
        err = ConnectionLost(f"connection to {self.address} lost{why}", self.refusal, exc)
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(err)
        self._waiting.clear()
        self._deadlines.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def call(self, code: int, body: bytes, timeout: float) -> Frame:
        if not self.is_open:
            # the broker may have refused the connection (opaque 0) before the first request
            why = f": {self.refusal[1]}" if self.refusal else ""
            raise ConnectionLost(f"connection to {self.address} is closed{why}", self.refusal)
        opaque = next(self._ids) & 0xFFFFFFFF or 1  # 0 is the broker's connection-level answer
        loop = self._loop
        fut = loop.create_future()
        self._waiting[opaque] = fut
        poll = self._poll
        if poll is not None:
            poll.waiting += 1  # before the write: its touch sees this request waiting
        self._write(encode_frame(0, code, opaque, body))
        # The answer's future is awaited itself, failed at its deadline (`_expire`): asyncio.wait_for
        # would wake this task through a second future, one loop iteration after the answer came.
        when = loop.time() + timeout
        deadlines = self._deadlines
        heapq.heappush(deadlines, (when, opaque, fut))
        if self._timer is None or when < self._timer.when():
            self._arm(when)
        elif len(deadlines) > 64 + 4 * len(self._waiting):   # mostly answered ones: drop them
            self._deadlines = [d for d in deadlines if not d[2].done()]
            heapq.heapify(self._deadlines)
        try:
            return await fut
        except _NoAnswer:
            self._waiting.pop(opaque, None)
            raise RequestTimeout(f"{_request_name(code)} to {self.address}: no answer within {timeout:.1f}s") from None
        finally:
            if poll is not None:
                poll.waiting -= 1

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._expire)

    def _expire(self) -> None:
        """Fail every request past its deadline; re-arm for the next one still waiting."""
        self._timer = None
        deadlines = self._deadlines
        now = self._loop.time()
        while deadlines and (deadlines[0][0] <= now or deadlines[0][2].done()):
            _no_answer(heapq.heappop(deadlines)[2])
        if deadlines:
            self._arm(deadlines[0][0])

    def send_oneway(self, code: int, body: bytes) -> None:
        if self.is_open:
            self._write(encode_frame(FLAG_ONEWAY, code, 0, body))

    def close(self) -> None:
        if self.transport is not None:
            self._flush_out()  # what was sent before closing still leaves (the transport flushes it)
            self.transport.close()


def parse_brokers(brokers) -> list[str]:
    if isinstance(brokers, str):
        brokers = [b.strip() for b in brokers.replace(";", ",").split(",")]
    out = [b for b in brokers if b]
    if not out:
        raise ValueError("at least one broker address (HOST:PORT) is needed")
    for b in out:
        host, sep, port = b.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"broker address must be HOST:PORT, got {b!r}")
    return out


class BrokerClient:
    """Requests to the brokers of a list, reconnecting with backoff and following the master.

    Every new connection starts with a HEARTBEAT that registers the client's producer groups (so a
    reconnected producer gets its check-backs again) and tells the broker's role. A client that
    `require_master` passes over slaves, and on a "not master" answer (a slave's
    SLAVE_NOT_AVAILABLE, a deposed master's CONTROLLER_FENCED_MASTER_EPOCH) finds the master and
    retries, within the deadline, the requests that are safe to repeat.

    A master can be deposed without knowing it (paused or cut off while a slave was promoted): it
    answers nothing, or SLAVE_NOT_AVAILABLE because its slaves left. So when a repeatable request
    waits longer than SUSPECT_AFTER, or such a master refuses it, the client asks the other
    addresses; one that leads at a higher epoch takes the request (and the old master is told,
    so that it checks and fences itself).
    """

    def __init__(self, brokers, *, client_id: str = "", producer_groups: list[str] | None = None,
                 consumer_groups: list[str] | None = None, require_master: bool = True, request_timeout: float = 10.0, connect_timeout: float = 3.0,
                 on_request: Callable[[Connection, Frame], None] | None = None, credentials=None, tls=None):
        self.addresses = parse_brokers(brokers)
        self.credentials = as_credentials(credentials)
        self.tls = as_tls(tls)
        self._ssl = self.tls.context() if self.tls is not None else None
        self.client_id = client_id
        self.producer_groups = producer_groups or []
        self.consumer_groups = consumer_groups or []
        self.require_master = require_master
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self._on_request = on_request
        self._conn: Connection | None = None
        self._conn_epoch = 0  # the epoch the connected broker led at when it answered our heartbeat
        self.newest_master: tuple[int, str] = (0, "")  # (epoch, address): the newest master seen
        self._probed_at = 0.0
        self._connecting: asyncio.Future | None = None
        self._index = 0
        self._closed = False

    @property
    def address(self) -> str:
        return self._conn.address if self._conn is not None else ""

    async def connection(self, deadline: float) -> Connection:
        conn = self._conn
        if conn is not None and conn.is_open:
            return conn
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect(deadline))
            # shared by every request waiting to connect; if they all gave up, its end is nobody's
            self._connecting.add_done_callback(_seen)
        return await asyncio.shield(self._connecting)

    async def _connect(self, deadline: float) -> Connection:
        delay = 0.05
        errors: dict[str, str] = {}
        answered = True   # every broker of this round answered, none as master: a role change under way
        while not self._closed:
            address = self.addresses[self._index % len(self.addresses)]
            conn = Connection(address, ssl_context=self._ssl,
                              server_hostname=self.tls.server_hostname if self.tls is not None else None)
            if self._on_request is not None:
                conn._on_request = lambda frame, c=conn: self._on_request(c, frame)
            try:
                await conn.open(min(self.connect_timeout, max(deadline - time.monotonic(), 0.01)))
                if self.credentials is not None:
                    await authenticate(conn, self.credentials, self.connect_timeout)
                hb = await self._heartbeat(conn)
                if hb.role == "master":
                    self._saw_master(hb.epoch, address)
                if self.require_master and hb.role != "master":
                    if hb.master and hb.master not in self.addresses:
                        self.addresses.append(hb.master)  # the slave says where the master is
                    raise _NotMaster(f"{hb.role} at epoch {hb.epoch}")
                if self.require_master and hb.epoch < self.newest_master[0]:
                    raise _NotMaster(f"master at epoch {hb.epoch}, deposed by epoch {self.newest_master[0]}")
                self._conn, self._conn_epoch = conn, hb.epoch
                return conn
            except (BrokerError, TlsHandshakeError):
                conn.close()  # refused credentials, a group they may not act for, TLS: the same on every try
                raise
            except ConnectionLost as e:
                conn.close()
                fatal = e.fatal(address)
                if fatal is None and self._ssl is not None and not conn.answered and e.cause is None:
                    # TLS 1.3 checks client certificates after the client's side of the handshake: a
                    # broker that wants one, or does not trust the one given, closes before answering
                    fatal = TlsHandshakeError(
                        f"TLS with {address}: the broker closed the connection before answering; " + (
                            "it probably does not accept this client certificate (is it signed by the broker's "
                            "client CA?)" if self.tls.cert_file else
                            "it probably requires a client certificate (TlsConfig(cert_file=..., key_file=...), "
                            "CLI --tls-cert)"))
                if fatal is not None:
                    raise fatal from None
                errors[address] = str(e)
                log.debug("connecting to %s: %s", address, e)
                answered = False
                self._index += 1
            except (OSError, asyncio.TimeoutError, RequestTimeout, _NotMaster) as e:
                conn.close()
                errors[address] = str(e) or type(e).__name__
                log.debug("connecting to %s: %s", address, errors[address])
                answered = answered and isinstance(e, _NotMaster)
                self._index += 1
            if self._index % len(self.addresses) == 0:  # tried them all: back off
                if time.monotonic() + delay > deadline:
                    raise BrokerUnavailable(("no master among " if self.require_master else "no broker reachable: ")
                                            + "; ".join(f"{a}: {m}" for a, m in errors.items()))
                await asyncio.sleep(delay * (0.5 + random.random()))
                # brokers that answer cost little to ask again, and a switchover promotes within
                # moments: a long backoff there would be most of the stall clients see
                delay = min(delay * 2, NOT_MASTER_BACKOFF_MAX if answered else 2.0)
                answered = True
        raise BrokerUnavailable("client is closed")

    def _heartbeat_body(self, register: bool = True) -> bytes:
        """`register`: as this client's producer and consumer groups' member. A probe does not: the
        broker ties a member to the connection of its latest heartbeat and drops it when that one
        closes, and a probe's closes at once (it may reach this client's own master under another
        name)."""
        epoch, address = self.newest_master
        if not register:
            return encode(HeartbeatRequest(self.client_id, [], [], epoch, address))
        return encode(HeartbeatRequest(self.client_id, self.producer_groups, self.consumer_groups, epoch, address))

    def _saw_master(self, epoch: int, address: str) -> None:
        if epoch > self.newest_master[0]:
            self.newest_master = (epoch, address)

    async def _heartbeat(self, conn: Connection, timeout: float | None = None, register: bool = True
                         ) -> HeartbeatResponse:
        frame = await conn.call(RequestCode.HEARTBEAT, self._heartbeat_body(register), timeout or self.connect_timeout)
        if frame.code in (ResponseCode.UNAUTHORIZED, ResponseCode.NO_PERMISSION, ResponseCode.TLS_REQUIRED):
            # wrong or missing credentials, or a group these credentials may not act for: final
            raise broker_error(conn.address, "HEARTBEAT", frame.code, _remark(frame))
        if frame.code != ResponseCode.SUCCESS:
            raise ConnectionLost(f"heartbeat refused by {conn.address}: {_remark(frame)}")
        return _heartbeat_decoder.decode(frame.body)

    def _drop(self, conn: Connection) -> None:
        if self._conn is conn:
            self._conn = None
            self._index += 1
        conn.close()

    async def request(self, code: RequestCode, body, response_type=None, *, timeout: float | None = None,
                      retry: bool = True):
        """Send a request and decode the answer; BrokerError on an error code.

        With `retry`, a lost connection or a "not master" answer is retried on the master until the
        timeout; only pass it for requests that are safe to repeat (idempotent ones).
        """
        timeout = self.request_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        payload = encode(body)
        watch = retry and self.require_master and len(self.addresses) > 1
        while True:
            conn = self._conn  # (connected: no coroutine of `connection` to make and await per request)
            if conn is None or not conn.is_open:
                conn = await self.connection(deadline)
            try:
                call = conn.call(code, payload, max(deadline - time.monotonic(), 0.01))
                frame = await (self._answer_or_newer_master(conn, call) if watch else call)
                if frame is None:  # moved to a newer master: send it there
                    continue
            except ConnectionLost as e:
                name = _request_name(code)
                fatal = e.fatal(conn.address, name)
                if fatal is not None:
                    raise fatal from None
                unprocessed = e.refusal is not None  # the broker said it closes: it never read this one
                if (not retry and not unprocessed) or time.monotonic() >= deadline:
                    raise BrokerUnavailable(f"{name}: {e}") from None
                continue
            if frame.code == ResponseCode.SUCCESS:
                break
            remark, name = _remark(frame), _request_name(code)
            if (retry and self.require_master and frame.code in _NOT_MASTER and time.monotonic() < deadline
                    and (not await self._still_master(conn) or await self._move_to_newer_master(conn, now=True))):
                log.debug("%s: %s is not the master (%s)", name, conn.address, remark)
                _warnings.warning("not master", "%s: %s is not the master (%s); looking for the master", name,
                                  conn.address, remark)
                self._drop(conn)
                continue
            raise broker_error(conn.address, name, frame.code, remark)
        if response_type is None:
            return None
        return decoder(response_type).decode(frame.body)

    async def _answer_or_newer_master(self, conn: Connection, call) -> Frame | None:
        """The answer to `call`; or None if, while it was not coming, a newer master turned up."""
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait((task,), timeout=SUSPECT_AFTER)
                if done:
                    return task.result()
                if await self._move_to_newer_master(conn):
                    return None
        finally:
            if not task.done():  # moved on, or the caller gave up: the answer no longer matters
                task.cancel()
                task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _move_to_newer_master(self, conn: Connection, now: bool = False) -> bool:
        """Ask the other addresses (at most once per SUSPECT_AFTER unless `now`) for a master at a
        higher epoch than `conn`'s broker; if one leads, go there and tell the old master."""
        if not now and time.monotonic() - self._probed_at < SUSPECT_AFTER:
            return False
        self._probed_at = time.monotonic()
        others = [a for a in self.addresses if a != conn.address]
        answers = await asyncio.gather(*(self._probe(a) for a in others))
        for address, hb in zip(others, answers):
            if hb is not None and hb.role == "master":
                self._saw_master(hb.epoch, address)
        epoch, address = self.newest_master
        if epoch <= self._conn_epoch or address == conn.address:
            return False
        _warnings.warning("newer master", "%s leads at epoch %d, above %s's %d: moving there", address, epoch,
                          conn.address, self._conn_epoch)
        conn.send_oneway(RequestCode.HEARTBEAT, self._heartbeat_body())  # the old master checks and fences itself
        self._drop(conn)
        self._index = self.addresses.index(address)
        return True

    async def _probe(self, address: str) -> HeartbeatResponse | None:
        conn = Connection(address, ssl_context=self._ssl,
                          server_hostname=self.tls.server_hostname if self.tls is not None else None)
        try:
            await conn.open(SUSPECT_AFTER)
            if self.credentials is not None:
                await authenticate(conn, self.credentials, SUSPECT_AFTER)
            return await self._heartbeat(conn, SUSPECT_AFTER, register=False)
        except (ClientError, ConnectionLost, OSError, asyncio.TimeoutError):
            return None
        finally:
            conn.close()

    async def _still_master(self, conn: Connection) -> bool:
        """SLAVE_NOT_AVAILABLE also answers a SYNC write on a master without slaves: ask which it is."""
        try:
            return (await self._heartbeat(conn)).role == "master"
        except (ConnectionLost, RequestTimeout):
            return False

    @property
    def closed(self) -> bool:
        return self._closed

    def send_oneway(self, code: int, body) -> None:
        if self._conn is not None:
            self._conn.send_oneway(code, encode(body))

    async def until_lost(self, timeout: float) -> None:
        """Return once the connection in use now ends, or after `timeout` s (at once: none is open).
        A client the broker calls back (check-backs) connects again then, not at its next heartbeat."""
        conn = self._conn
        if conn is None or not conn.is_open:
            return
        try:
            await asyncio.wait_for(conn.closed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def heartbeat(self) -> HeartbeatResponse:
        """Renew this client's registration (producer and consumer groups) with the broker. A lost
        connection is a ClientError here too (BrokerUnavailable): the next call connects again."""
        conn = await self.connection(time.monotonic() + self.request_timeout)
        try:
            return await self._heartbeat(conn)
        except ConnectionLost as e:
            self._drop(conn)
            raise BrokerUnavailable(f"heartbeat to {conn.address}: {e}") from e

    async def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _NotMaster(Exception):
    pass


def _seen(task: asyncio.Future) -> None:
    """Mark a shared task's exception as retrieved: its awaiters, if any, still get it."""
    if not task.cancelled():
        task.exception()


_NOT_MASTER = (ResponseCode.SLAVE_NOT_AVAILABLE, ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH)
# A repeatable request unanswered this long makes the client ask the other addresses whether a
# newer master leads (a deposed master may be paused, or cut off, and never answer).
SUSPECT_AFTER = 1.0
# The longest wait between rounds of connecting while every broker answers and none is master
# (elsewhere up to 2 s: brokers that do not answer are not asked in a tight loop).
NOT_MASTER_BACKOFF_MAX = 0.2
_heartbeat_decoder = decoder(HeartbeatResponse)


def _remark(frame: Frame) -> str:
    try:
        return _error_decoder.decode(frame.body).remark
    except BODY_ERRORS:
        return "(no detail)"
