"""Transactional producers: half message, local transaction, acknowledged END_TRANSACTION, and
answers to the broker's check-backs.

Flow (DESIGN.md, "Transaction semantics"): the messages are stored as one half message; on
success the listener's `execute_local_transaction` runs; its answer is sent with END_TRANSACTION.
An exception or None counts as UNKNOWN, which sends nothing and leaves the decision to check-back.
If the half send answers FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE, the local
transaction is not run and the messages are rolled back.

The requests and those rules are the TransactionSession's (transaction_session.py), shared with the
Spark data source; a producer adds the listener, its group's registration and the check-backs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
import time

from txbroker.client import background
from txbroker.client.connection import BrokerClient, Connection
from txbroker.client.errors import ClientError
from txbroker.client.log_limit import RepeatedWarnings
from txbroker.client.producer import as_list, new_client_id
from txbroker.client.transaction_session import (
    EndsInFlight, LocalTransactionState, TransactionSendResult, TransactionSession, local_decision, local_decision_async,
)
from txbroker.protocol.bodies import (
    CheckTransactionStateRequest, EndTransactionResponse, HeartbeatRequest, Message, MessageExt, SendResponse, decoder,
)
from txbroker.protocol.codes import RequestCode
from txbroker.protocol.framing import Frame

__all__ = ["AsyncTransactionProducer", "LocalTransactionState", "TransactionListener", "TransactionProducer",
           "TransactionSendResult"]

log = logging.getLogger(__name__)
_warnings = RepeatedWarnings(log)

HEARTBEAT_S = 30.0  # RocketMQ's heartbeatBrokerInterval
RETRY_FIRST_S = 0.5  # after a failed heartbeat, doubling up to HEARTBEAT_S

_check_decoder = decoder(CheckTransactionStateRequest)
_EXECUTE, _CHECK = "execute_local_transaction", "check_local_transaction"


class TransactionListener:
    """Implement both methods. Each returns a LocalTransactionState; None or an exception is UNKNOWN."""

    def execute_local_transaction(self, msg, arg) -> LocalTransactionState:
        raise NotImplementedError

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        raise NotImplementedError


class AsyncTransactionProducer:
    """asyncio transactional producer. Listener methods may be plain or `async def`."""

    def __init__(self, group: str, brokers, listener: TransactionListener, *, request_timeout: float = 10.0,
                 check_workers: int = 4, check_queue: int = 2000, credentials=None, tls=None,
                 wait_end: bool = True):
        """`wait_end=False`: send_message_in_transaction returns once its END_TRANSACTION is on its
        way, not acknowledged: `result.ended` is done when it is (queue_offsets) or could not be
        (end_error, check-back decides); flush() and close() wait for every one still in flight.
        A producer that sends its next transaction at once has the END and the next half message
        travel, and be answered, together: one round trip a transaction (RocketMQ's END is one-way
        and never acknowledged)."""
        if not group:
            raise ValueError("a transactional producer needs a producer group")
        self.group = group
        self.listener = listener
        self.wait_end = wait_end
        self._ending = EndsInFlight()
        self.client_id = new_client_id()
        self.client = BrokerClient(brokers, client_id=self.client_id, producer_groups=[group],
                                   request_timeout=request_timeout, on_request=self._on_request,
                                   credentials=credentials, tls=tls)
        self.session = TransactionSession(self.client, group)
        # Check-backs run on a bounded pool, as RocketMQ's checkExecutor; beyond the queue they are
        # dropped (the broker asks again at its next interval). An `async def` listener gets the
        # same bounds: check_workers at once, check_queue in all.
        self._check_pool = concurrent.futures.ThreadPoolExecutor(check_workers, thread_name_prefix="txbroker-check")
        self._check_slots = threading.BoundedSemaphore(check_queue)
        self._async_check_workers = asyncio.Semaphore(check_workers)
        self._heartbeat_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> "AsyncTransactionProducer":
        self._loop = asyncio.get_running_loop()
        await self.client.connection(time.monotonic() + self.client.request_timeout)
        self._heartbeat_task = asyncio.ensure_future(self._heartbeats())
        return self

    async def _heartbeats(self) -> None:
        """Keep this producer registered with its group's master, which sends it check-backs: every
        HEARTBEAT_S, at once when the connection ends (a new master counts its checks whether or not a
        producer is there, and parks what nobody answers), and soon again after a failure."""
        retry = 0.0
        while not self.client.closed:
            if retry:
                await asyncio.sleep(retry)
            else:
                await self.client.until_lost(HEARTBEAT_S)
                await asyncio.sleep(0)  # (a closed client ends the loop before it reconnects)
                if self.client.closed:
                    return
            try:
                await self.client.request(RequestCode.HEARTBEAT, HeartbeatRequest(self.client_id, [self.group]))
                retry = 0.0
            except ClientError as e:
                retry = min(max(retry * 2, RETRY_FIRST_S), HEARTBEAT_S)
                _warnings.warning("producer heartbeat failed", "producer group %s: heartbeat failed (again in "
                                  "%.1f s): %s", self.group, retry, e)
            except Exception:  # noqa: BLE001 - a bug must not end the loop unseen
                retry = HEARTBEAT_S
                log.exception("producer group %s: heartbeat failed", self.group)

    async def flush(self) -> None:
        """Wait until every END_TRANSACTION sent without waiting is acknowledged or given up on (each
        is retried until the request timeout; the outcome is in its result)."""
        await self._ending.wait()

    async def close(self) -> None:
        await self.flush()
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        await self.client.close()
        self._check_pool.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc):
        await self.close()

    # ---- the two phases --------------------------------------------------------------------------

    async def prepare(self, msgs: list[Message], transaction_id: str | None = None) -> SendResponse:
        """Store the messages as one half message. Safe to retry: the id makes it idempotent."""
        return (await self.session.prepare(msgs, transaction_id)).response

    async def end(self, transaction_id: str, state: LocalTransactionState, commit_log_offset: int = 0,
                  from_check: bool = False) -> EndTransactionResponse:
        """Send the decision; idempotent, so retried across reconnects until the timeout."""
        return await self.session.end(transaction_id, state, commit_log_offset, from_check)

    async def send_message_in_transaction(self, msg_or_msgs, arg=None, transaction_id: str | None = None,
                                          wait_end: bool | None = None) -> TransactionSendResult:
        """Half message, local transaction, END_TRANSACTION; `wait_end` (default: the producer's)
        False returns before the END is acknowledged (see __init__)."""
        begun = await self.session.begin(as_list(msg_or_msgs), transaction_id)
        if isinstance(begun, TransactionSendResult):  # not safely stored: rolled back, no local transaction
            return begun
        state = await local_decision_async(_EXECUTE, begun.transaction_id, self.listener.execute_local_transaction,
                                           msg_or_msgs, arg)
        return self._ending.track(await self.session.finish(begun, state, self.wait_end if wait_end is None else wait_end))

    # ---- check-back ------------------------------------------------------------------------------

    def _on_request(self, conn: Connection, frame: Frame) -> None:
        if frame.code != RequestCode.CHECK_TRANSACTION_STATE:
            log.warning("ignoring request code %d from %s", frame.code, conn.address)
            return
        try:
            req = _check_decoder.decode(frame.body)
        except Exception as e:  # noqa: BLE001 - a bad frame from the broker must not kill the client
            log.error("malformed CHECK_TRANSACTION_STATE from %s: %s", conn.address, e)
            return
        msg = req.message
        msg.transaction_id = req.transaction_id
        if not self._check_slots.acquire(blocking=False):
            log.warning("check-back queue full: dropping the check of %s (the broker will ask again)", req.transaction_id)
            return
        if inspect.iscoroutinefunction(self.listener.check_local_transaction):
            asyncio.ensure_future(self._answer_async(req))
            return
        fut = self._loop.run_in_executor(self._check_pool, self._run_check, msg, req.transaction_id)
        fut.add_done_callback(lambda f, r=req: self._checked(r, f))

    def _run_check(self, msg: MessageExt, txid: str) -> LocalTransactionState:
        try:
            return local_decision(_CHECK, txid, self.listener.check_local_transaction, msg)
        finally:
            self._check_slots.release()

    def _checked(self, req: CheckTransactionStateRequest, fut) -> None:
        if fut.cancelled():
            return
        asyncio.ensure_future(self.session.answer_check(req.transaction_id, fut.result(), req.commit_log_offset))

    async def _answer_async(self, req: CheckTransactionStateRequest) -> None:
        try:
            async with self._async_check_workers:
                state = await local_decision_async(_CHECK, req.transaction_id, self.listener.check_local_transaction,
                                                   req.message)
        finally:
            self._check_slots.release()
        await self.session.answer_check(req.transaction_id, state, req.commit_log_offset)


class TransactionProducer(background.Blocking):
    """Blocking transactional producer: the local transaction runs in the caller's thread."""

    def __init__(self, group: str, brokers, listener: TransactionListener, **kwargs):
        self._async = AsyncTransactionProducer(group, brokers, listener, **kwargs)

    @property
    def group(self) -> str:
        return self._async.group

    @property
    def broker_address(self) -> str:
        """HOST:PORT of the broker this producer talks to now (the master it found), or "" when none."""
        return self._async.client.address

    def send_message_in_transaction(self, msg_or_msgs, arg=None, transaction_id: str | None = None,
                                    wait_end: bool | None = None) -> TransactionSendResult:
        """As AsyncTransactionProducer's; without waiting for the END, flush() waits for them all."""
        a = self._async
        begun = background.run(a.session.begin(as_list(msg_or_msgs), transaction_id))
        if isinstance(begun, TransactionSendResult):  # not safely stored: rolled back, no local transaction
            return begun
        # the local transaction runs here, in the caller's thread (its database session, its locks)
        state = local_decision(_EXECUTE, begun.transaction_id, self.listener.execute_local_transaction, msg_or_msgs,
                               arg)
        return background.run(self._finish(begun, state, a.wait_end if wait_end is None else wait_end))

    async def _finish(self, begun, state, wait_end: bool) -> TransactionSendResult:
        return self._async._ending.track(await self._async.session.finish(begun, state, wait_end))

    def flush(self) -> None:
        """Wait until every END_TRANSACTION sent without waiting is acknowledged or given up on."""
        background.run(self._async.flush())

    @property
    def listener(self) -> TransactionListener:
        """What runs the local transactions and answers check-backs; may be replaced while running."""
        return self._async.listener

    @listener.setter
    def listener(self, listener: TransactionListener) -> None:
        self._async.listener = listener

    def end(self, transaction_id: str, state: LocalTransactionState,
            commit_log_offset: int = 0) -> EndTransactionResponse:
        """Decide a transaction by hand (one this producer prepared, or one reported UNKNOWN)."""
        return background.run(self._async.end(transaction_id, state, commit_log_offset))
