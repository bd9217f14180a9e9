"""From a request frame to its Reply: admission, the processor, and errors mapped to codes.

The connection (connection.py) decodes frames and writes answers; between the two, `dispatch`
admits the request (authentication, when on; the broker-wide budget of unacked bytes), calls its
processor and hands the Reply to `conn.respond` now, or once the request finishes (a coroutine)
or its change is durable. Such requests hold their bytes in the budget and count as in flight on
the connection (`conn.hold`/`conn.release`: its flow control) until then.

A processor's exception is a value too: ERROR_REPLIES says, in one place, which code each kind of
failure is answered with; anything else is a bug, logged, and answered SYSTEM_ERROR (as RocketMQ
maps store statuses to response codes in one table with a default).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import TYPE_CHECKING, Callable

import msgspec

from txbroker.broker.limits import busy
from txbroker.broker.replies import Reply, RequestError
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.framing import FLAG_RESPONSE, Frame
from txbroker.store.group_commit import DurableFuture

if TYPE_CHECKING:
    from txbroker.broker.connection import BrokerConnection

log = logging.getLogger(__name__)

REQUEST_NAMES = {c.value: c.name for c in RequestCode}
_SASL = RequestCode.SASL_AUTHENTICATE
# What a master handing over answers at once (role.gate): who it is, where the route is, and its
# slaves' replication. Every other request waits until the handover is done or abandoned, and is
# then answered by what the broker has become (a slave: "not master", and the client moves).
UNGATED = frozenset({RequestCode.HEARTBEAT, RequestCode.UNREGISTER_CLIENT, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                     RequestCode.GET_BROKER_CLUSTER_INFO, RequestCode.REPLICATION_SUBSCRIBE,
                     RequestCode.REPLICATION_ACK, RequestCode.REPLICATION_SNAPSHOT, RequestCode.SASL_AUTHENTICATE})

# A processor's exception -> its answer, given the request's name: the first entry whose type
# matches. Anything else is SYSTEM_ERROR (see Dispatcher.failure). Frames that cannot be decoded
# never get here: the connection answers them MESSAGE_ILLEGAL itself.
ERROR_REPLIES: tuple[tuple[type[BaseException], Callable[[BaseException, str], Reply]], ...] = (
    (RequestError, lambda e, name: Reply(e.code, None, e.remark)),
    (UnicodeDecodeError, lambda e, name: Reply(
        ResponseCode.MESSAGE_ILLEGAL, None,
        f"malformed {name} request body: a string is not valid UTF-8 ({e.reason} at byte {e.start})")),
    # ValidationError included: it names the field
    (msgspec.DecodeError, lambda e, name: Reply(ResponseCode.MESSAGE_ILLEGAL, None,
                                                f"malformed {name} request body: {e}")),
)


def held_reply(reply: Reply, durable: asyncio.Future) -> Reply:
    """What a reply held until its change was durable becomes, now that it is (or failed)."""
    err = None if durable.cancelled() else durable.exception()
    if err is None and not durable.cancelled():
        return reply
    if isinstance(err, RequestError):  # e.g. FLUSH_SLAVE_TIMEOUT: stored, but not as promised
        return Reply(err.code, None, err.remark)
    return Reply(ResponseCode.SYSTEM_ERROR, None, "the broker could not store the request; it is restarting")


async def _after_gate(gate: asyncio.Future, handler, conn: BrokerConnection, body: bytes) -> Reply | None:
    """A request that came while its master hands over: handled once the gate opens, by whatever the
    broker is then (a slave answers "not master"; a master whose handover was abandoned, as usual)."""
    await asyncio.shield(gate)
    reply = handler(conn, body)
    if inspect.isawaitable(reply):
        reply = await reply
    if reply is not None and reply.durable is not None:
        await asyncio.wait((reply.durable,))
        reply = held_reply(reply, reply.durable)
    return reply


class Dispatcher:
    """The broker's side of dispatch (processors, authentication, budget, metrics). The connection
    is passed in, never kept: one connection's state stays on it, and no reference cycle forms."""

    __slots__ = ("_handlers", "_auth", "_budget", "_metrics", "_role")

    def __init__(self, broker):
        self._handlers = broker.handlers
        self._auth = broker.auth  # AuthService, or None when authentication is off
        self._budget = broker.unacked
        self._metrics = broker.metrics
        self._role = broker.role

    def dispatch(self, conn: BrokerConnection, frame: Frame) -> None:
        if frame.flags & FLAG_RESPONSE:
            return  # check-backs are one-way: nothing to match an answer to
        auth = self._auth
        if auth is not None and frame.code != _SASL:
            refusal = auth.admit(conn)
            if refusal is not None:
                refusal.close = True
                conn.respond(frame, refusal, 0.0)
                return
        handler = self._handlers.get(frame.code)
        if handler is None:
            conn.respond(frame, Reply(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, None,
                                      f"request code {frame.code} is not supported"), 0.0)
            return
        size = len(frame.body)
        budget = self._budget
        if budget.used and budget.used + size > budget.limit:
            self._metrics.limit_refusals.labels("max_unacked_bytes").inc()
            conn.respond(frame, busy("max_unacked_bytes", f"the broker holds {budget.used} bytes of requests "
                                                          f"not yet answered (limit {budget.limit})"), 0.0)
            return
        started = time.perf_counter()
        gate = self._role.gate
        if gate is not None and frame.code not in UNGATED:
            reply = _after_gate(gate, handler, conn, frame.body)
        else:
            try:
                reply = handler(conn, frame.body)
            except Exception as e:  # noqa: BLE001 - every failure becomes an answer, see failure()
                reply = self.failure(conn, frame, e)
        if reply is None:  # a one-way request handled in full
            return
        if type(reply) is not Reply and inspect.isawaitable(reply):  # (the type test first: most replies are)
            budget.used += size
            conn.hold(size)
            task = asyncio.ensure_future(reply)
            task.add_done_callback(lambda t, c=conn, f=frame, s=started, n=size: self._async_done(c, f, t, s, n))
            return
        durable = reply.durable
        if durable is not None:
            if not durable.done():
                budget.used += size
                conn.hold(size)
                if type(durable) is DurableFuture:  # (a batch's: answered as it is written)
                    waiting = durable.waiting
                    if waiting is None:
                        durable.waiting = [(conn, frame, reply, started, size)]
                        durable.on_resolved = self._answer_waiting
                    else:
                        waiting.append((conn, frame, reply, started, size))
                    return
                durable.add_done_callback(
                    lambda d, c=conn, f=frame, r=reply, s=started, n=size: self._durable_done(c, f, r, d, s, n))
                return
            reply = held_reply(reply, durable)
        conn.respond(frame, reply, started)

    # The budget is given back before the connection's count: release() may dispatch what
    # waited, and that is admitted against the budget.

    def _durable_done(self, conn: BrokerConnection, frame: Frame, reply: Reply, durable: asyncio.Future,
                      started: float, size: int) -> None:
        self._budget.used -= size
        conn.release(size)
        conn.respond(frame, held_reply(reply, durable), started)

    def _answer_waiting(self, durable: DurableFuture) -> None:
        """The requests held on `durable`, answered as it resolves: their answers leave now, one
        write per connection. Nothing waiting to be dispatched is started from here (the resolving
        code may be looping over its own waiters): a backlog resumes in the next loop iteration."""
        budget = self._budget
        written = []
        failed = durable.exception() is not None  # (one outcome for them all; it cannot be cancelled)
        for conn, frame, reply, started, size in durable.waiting:
            budget.used -= size
            try:
                conn.release(size, resume_now=False)
                if conn.respond(frame, held_reply(reply, durable) if failed else reply, started, flush=False):
                    written.append(conn)
            except Exception:  # noqa: BLE001 - one answer failing must not leave the others unanswered
                log.exception("answering %s from %s failed", REQUEST_NAMES.get(frame.code, frame.code), conn.peer)
        durable.waiting = None
        for conn in written:
            conn.flush_now()

    def _async_done(self, conn: BrokerConnection, frame: Frame, task: asyncio.Task, started: float,
                    size: int) -> None:
        self._budget.used -= size
        conn.release(size)
        if task.cancelled():
            return
        exc = task.exception()
        reply = self.failure(conn, frame, exc) if exc is not None else task.result()
        if reply is not None:  # (None: a one-way request that waited at the gate)
            conn.respond(frame, reply, started)

    @staticmethod
    def failure(conn: BrokerConnection, frame: Frame, e: BaseException) -> Reply:
        """The answer to a request whose processor raised `e` (ERROR_REPLIES, or SYSTEM_ERROR)."""
        name = REQUEST_NAMES.get(frame.code, str(frame.code))
        for kind, answer in ERROR_REPLIES:
            if isinstance(e, kind):
                return answer(e, name)
        log.error("%s from %s failed", name, conn.peer, exc_info=e)  # also called outside the except (async handlers)
        return Reply(ResponseCode.SYSTEM_ERROR, None, f"{name} failed on the broker: {type(e).__name__}: {e}")
