"""Transactional producers: half message, local transaction, acknowledged END_TRANSACTION, and
answers to the broker's check-backs.

Flow (DESIGN.md, "Transaction semantics"): the messages are stored as one half message; on
success the listener's `execute_local_transaction` runs; its answer is sent with END_TRANSACTION.
An exception or None counts as UNKNOWN, which sends nothing and leaves the decision to check-back.
If the half send answers FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE, the local
transaction is not run and the messages are rolled back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import inspect
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from txbroker.client import background
from txbroker.client.connection import BrokerClient, Connection
from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.log_limit import RepeatedWarnings
from txbroker.client.producer import as_list, new_client_id
from txbroker.protocol.bodies import (
    CheckTransactionStateRequest, EndTransactionRequest, EndTransactionResponse, HeartbeatRequest, Message,
    MessageExt, SendRequest, SendResponse, decoder,
)
from txbroker.protocol.codes import RequestCode, ResponseCode, TransactionState
from txbroker.protocol.framing import Frame

log = logging.getLogger(__name__)
_warnings = RepeatedWarnings(log)

_NOT_STORED_CODES = (ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE)
_check_decoder = decoder(CheckTransactionStateRequest)


class LocalTransactionState(enum.Enum):
    COMMIT = TransactionState.COMMIT
    ROLLBACK = TransactionState.ROLLBACK
    UNKNOWN = TransactionState.UNKNOWN


class TransactionListener:
    """Implement both methods. Each returns a LocalTransactionState; None or an exception is UNKNOWN."""

    def execute_local_transaction(self, msg, arg) -> LocalTransactionState:
        raise NotImplementedError

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        raise NotImplementedError


@dataclass
class TransactionSendResult:
    send_status: str  # SEND_OK, or the code that stopped the half send
    transaction_id: str
    msg_ids: list[str]
    local_state: LocalTransactionState
    commit_log_offset: int = 0
    queue_offsets: list[int] = field(default_factory=list)  # where committed messages landed
    end_error: str = ""  # END_TRANSACTION could not be delivered: check-back will decide

    @property
    def msg_id(self) -> str:
        return self.msg_ids[0] if self.msg_ids else ""


def _state_of(value, where: str, txid: str) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    if value is not None:
        log.warning("%s for transaction %s returned %r, not a LocalTransactionState: UNKNOWN", where, txid, value)
    return LocalTransactionState.UNKNOWN


class AsyncTransactionProducer:
    """asyncio transactional producer. Listener methods may be plain or `async def`."""

    def __init__(self, group: str, brokers, listener: TransactionListener, *, request_timeout: float = 10.0,
                 check_workers: int = 4, check_queue: int = 2000, credentials=None, tls=None):
        if not group:
            raise ValueError("a transactional producer needs a producer group")
        self.group = group
        self.listener = listener
        self.client_id = new_client_id()
        self.client = BrokerClient(brokers, client_id=self.client_id, producer_groups=[group],
                                   request_timeout=request_timeout, on_request=self._on_request,
                                   credentials=credentials, tls=tls)
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
        while not self.client._closed:
            await asyncio.sleep(30)
            try:
                await self.client.request(RequestCode.HEARTBEAT, HeartbeatRequest(self.client_id, [self.group]))
            except ClientError as e:
                log.warning("heartbeat failed: %s", e)

    async def close(self) -> None:
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
        txid = transaction_id or uuid.uuid4().hex
        r: SendResponse = await self.client.request(
            RequestCode.SEND_MESSAGE, SendRequest(self.group, msgs, txid), SendResponse, retry=True)
        for m in msgs:
            m.transaction_id = txid
        return r

    async def end(self, transaction_id: str, state: LocalTransactionState, commit_log_offset: int = 0,
                  from_check: bool = False) -> EndTransactionResponse:
        """Send the decision; idempotent, so retried across reconnects until the timeout."""
        return await self.client.request(
            RequestCode.END_TRANSACTION,
            EndTransactionRequest(self.group, transaction_id, state.value, commit_log_offset, from_check),
            EndTransactionResponse, retry=True)

    async def send_message_in_transaction(self, msg_or_msgs, arg=None, transaction_id: str | None = None) -> TransactionSendResult:
        msgs = as_list(msg_or_msgs)
        txid = transaction_id or uuid.uuid4().hex
        try:
            sent = await self.prepare(msgs, txid)
        except BrokerError as e:
            if e.code in _NOT_STORED_CODES:
                return await self._not_stored(e, txid, msgs)
            raise
        state = await self._execute(msg_or_msgs, arg, sent.transaction_id)
        return await self._finish(sent, state)

    async def _execute(self, msg_or_msgs, arg, txid: str) -> LocalTransactionState:
        try:
            value = self.listener.execute_local_transaction(msg_or_msgs, arg)
            if inspect.isawaitable(value):
                value = await value
        except Exception:
            log.exception("execute_local_transaction for %s raised: UNKNOWN", txid)
            return LocalTransactionState.UNKNOWN
        return _state_of(value, "execute_local_transaction", txid)

    async def _finish(self, sent: SendResponse, state: LocalTransactionState) -> TransactionSendResult:
        result = TransactionSendResult("SEND_OK", sent.transaction_id, sent.msg_ids, state, sent.commit_log_offset)
        if state is LocalTransactionState.UNKNOWN:
            return result  # nothing to send: check-back decides
        try:
            r = await self.end(sent.transaction_id, state, sent.commit_log_offset)
            result.queue_offsets = r.queue_offsets
        except ClientError as e:
            _warnings.warning("END_TRANSACTION not delivered",
                              "END_TRANSACTION %s for %s not delivered (%s); check-back will resolve it",
                              state.name, sent.transaction_id, e)
            result.end_error = str(e)
        return result

    async def _not_stored(self, e: BrokerError, txid: str, msgs) -> TransactionSendResult:
        _warnings.warning("half message not safely stored", "half message not safely stored (%s): rolling back "
                          "without running the local transaction", e.code_name)
        result = TransactionSendResult(e.code_name, txid, [], LocalTransactionState.ROLLBACK)
        try:
            await self.end(txid, LocalTransactionState.ROLLBACK)
        except BrokerError as end_error:
            # The rollback may itself be "stored on the master only" (same replication state):
            # it is recorded there all the same, so only other refusals are worth reporting.
            if end_error.code not in _NOT_STORED_CODES:
                result.end_error = str(end_error)
        except ClientError as end_error:
            result.end_error = str(end_error)
        return result

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
            return _state_of(self.listener.check_local_transaction(msg), "check_local_transaction", txid)
        except Exception:
            log.exception("check_local_transaction for %s raised: UNKNOWN", txid)
            return LocalTransactionState.UNKNOWN
        finally:
            self._check_slots.release()

    def _checked(self, req: CheckTransactionStateRequest, fut) -> None:
        if fut.cancelled():
            return
        asyncio.ensure_future(self._answer(req, fut.result()))

    async def _answer_async(self, req: CheckTransactionStateRequest) -> None:
        try:
            async with self._async_check_workers:
                state = _state_of(await self.listener.check_local_transaction(req.message), "check_local_transaction",
                                  req.transaction_id)
        except Exception:
            log.exception("check_local_transaction for %s raised: UNKNOWN", req.transaction_id)
            state = LocalTransactionState.UNKNOWN
        finally:
            self._check_slots.release()
        await self._answer(req, state)

    async def _answer(self, req: CheckTransactionStateRequest, state: LocalTransactionState) -> None:
        try:
            await self.end(req.transaction_id, state, req.commit_log_offset, from_check=True)
        except BrokerError as e:
            # Already decided the other way, or gone: the broker keeps its decision; say so.
            _warnings.warning("check-back answer refused", "check-back answer %s for %s refused: %s", state.name,
                              req.transaction_id, e)
        except ClientError as e:
            _warnings.warning("check-back answer not delivered", "check-back answer for %s not delivered: %s",
                              req.transaction_id, e)


class TransactionProducer:
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

    def start(self) -> "TransactionProducer":
        background.run(self._async.start())
        return self

    def send_message_in_transaction(self, msg_or_msgs, arg=None, transaction_id: str | None = None) -> TransactionSendResult:
        a = self._async
        msgs = as_list(msg_or_msgs)
        txid = transaction_id or uuid.uuid4().hex
        try:
            sent = background.run(a.prepare(msgs, txid))
        except BrokerError as e:
            if e.code in _NOT_STORED_CODES:
                return background.run(a._not_stored(e, txid, msgs))
            raise
        try:
            state = _state_of(a.listener.execute_local_transaction(msg_or_msgs, arg), "execute_local_transaction",
                              sent.transaction_id)
        except Exception:
            log.exception("execute_local_transaction for %s raised: UNKNOWN", sent.transaction_id)
            state = LocalTransactionState.UNKNOWN
        return background.run(a._finish(sent, state))

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

    def shutdown(self) -> None:
        background.run(self._async.close())

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.shutdown()
