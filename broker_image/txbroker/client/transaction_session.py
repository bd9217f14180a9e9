"""One transaction session: half messages and decisions for one producer group, and nothing else.

    session = TransactionSession(client, "orders-pg")       # a BrokerClient; the session does not own it
    half = await session.prepare([Message("Orders", b"o1")], job_id="")   # Prepared: id, where it is stored
    await session.end(half, LocalTransactionState.COMMIT)   # or end_many([(half, state), ...])

No listener, no check-backs, no HEARTBEAT registration: those belong to whoever uses the session (the
transactional producers in transaction.py register the group and answer check-backs; a Spark task
registers nothing, since its transactions join a job that the broker ends). Kept apart from the
producers as aiokafka keeps its TransactionManager apart from its producer, so the asyncio producer,
its blocking form and the Spark data source send the same SEND_MESSAGE and END_TRANSACTION.

The rules every user shares live here once:
- `local_decision` (and its asyncio form): what a listener answered, where an exception, None or anything that is not a
  LocalTransactionState counts as UNKNOWN (which sends nothing and leaves the decision to check-back);
- `begin` / `finish`: a half send the broker stored without the durability asked for
  (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE) is rolled back before any local
  transaction runs; an END_TRANSACTION that cannot be delivered is reported, not raised, since
  check-back resolves it.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import uuid
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field

import msgspec

from txbroker.client.connection import BrokerClient
from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.log_limit import RepeatedWarnings
from txbroker.protocol.bodies import (
    EndTransactionRequest, EndTransactionResponse, JobInfo, Message, QueryJobRequest, SendRequest, SendResponse,
)
from txbroker.protocol.codes import RequestCode, ResponseCode, TransactionState
from txbroker.protocol.properties import share_properties

log = logging.getLogger(__name__)
_warnings = RepeatedWarnings(log)

# The half message is stored, but not as durably as asked (disk flush, slave): no local transaction
# may run on it, so it is rolled back.
NOT_STORED_CODES = (ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT,
                    ResponseCode.SLAVE_NOT_AVAILABLE)


class LocalTransactionState(enum.Enum):
    COMMIT = TransactionState.COMMIT
    ROLLBACK = TransactionState.ROLLBACK
    UNKNOWN = TransactionState.UNKNOWN


@dataclass
class TransactionSendResult:
    send_status: str  # SEND_OK, or the code that stopped the half send
    transaction_id: str
    msg_ids: list[str]
    local_state: LocalTransactionState
    commit_log_offset: int = 0
    queue_offsets: list[int] = field(default_factory=list)  # where committed messages landed
    end_error: str = ""  # END_TRANSACTION could not be delivered: check-back will decide
    groups: list[str] = field(default_factory=list)  # a cluster's producers: the home broker group, then the others
    # END_TRANSACTION sent without waiting (wait_end=False): done once it is acknowledged (queue_offsets
    # filled) or could not be delivered (end_error); it never raises. None: nothing left to wait for.
    ended: "asyncio.Future[None] | None" = field(default=None, repr=False, compare=False)

    @property
    def msg_id(self) -> str:
        return self.msg_ids[0] if self.msg_ids else ""


@dataclass(frozen=True)
class Prepared:
    """A half message the broker stored: what END_TRANSACTION needs to find it."""

    transaction_id: str
    commit_log_offset: int  # where it is stored; END_TRANSACTION is checked against it
    msg_ids: list[str]
    duplicate: bool = False  # the id was already prepared: nothing new was stored
    response: SendResponse | None = field(default=None, repr=False, compare=False)  # the broker's answer, as is


# ---- what a listener answered ------------------------------------------------------------------

def _state_of(value, where: str, txid: str) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    if value is not None:
        log.warning("%s for transaction %s returned %r, not a LocalTransactionState: UNKNOWN", where, txid, value)
    return LocalTransactionState.UNKNOWN


def _raised(where: str, txid: str) -> LocalTransactionState:
    log.exception("%s for %s raised: UNKNOWN", where, txid)
    return LocalTransactionState.UNKNOWN


def local_decision(where: str, txid: str, call, *args) -> LocalTransactionState:
    """Call a listener method (`where` names it in logs) for transaction `txid`, in this thread: its
    LocalTransactionState, or UNKNOWN for an exception, None or any other value (an awaitable
    included: this caller cannot wait for it)."""
    try:
        value = call(*args)
    except Exception:  # noqa: BLE001 - a failing listener is an undecided transaction, not a client failure
        return _raised(where, txid)
    return _state_of(value, where, txid)


async def local_decision_async(where: str, txid: str, call, *args) -> LocalTransactionState:
    """local_decision for a caller on an event loop: a method may also be `async def`."""
    try:
        value = call(*args)
        if inspect.isawaitable(value):
            value = await value
    except Exception:  # noqa: BLE001 - as in local_decision
        return _raised(where, txid)
    return _state_of(value, where, txid)


# ---- the session --------------------------------------------------------------------------------

class EndsInFlight:
    """The END_TRANSACTIONs a producer sent without waiting (wait_end=False), until each is done."""

    def __init__(self):
        self._ending: set[asyncio.Future] = set()

    def track(self, result: TransactionSendResult) -> TransactionSendResult:
        if result.ended is not None:
            self._ending.add(result.ended)
            result.ended.add_done_callback(self._ending.discard)
        return result

    async def wait(self) -> None:
        """Until every one is acknowledged or given up on (each retried until the request timeout;
        the outcome is in its result)."""
        while self._ending:
            await asyncio.gather(*list(self._ending))


class TransactionSession:
    """Half messages and their decisions for `group`, over `client` (which the caller opens and closes)."""

    def __init__(self, client: BrokerClient, group: str):
        if not group:
            raise ValueError("a transaction needs a producer group")
        self.client = client
        self.group = group
        self._shared_refused = False  # the broker refused SEND_MESSAGE_SHARED (it predates it)

    async def prepare(self, msgs: list[Message], transaction_id: str | None = None, job_id: str = "",
                      home: str = "", participants: list[str] | None = None,
                      properties: dict[str, str] | None = None) -> Prepared:
        """Store the messages as one half message (joining job `job_id` if given; a participant of the
        transaction of the same id that broker group `home` decides, if given; the home of one whose
        `participants` are on those groups, if given). `properties`: every message carries them
        (under its own), sent once for all. Safe to retry: the id makes it idempotent (a repeat
        answers `duplicate`). Every refusal raises BrokerError. The messages get the transaction id
        (a listener sees it on them)."""
        txid = transaction_id or uuid.uuid4().hex
        r = await self._send(SendRequest(self.group, msgs, txid, job_id, home, participants or [], properties or {}))
        for m in msgs:
            m.transaction_id = txid
        return Prepared(r.transaction_id or txid, r.commit_log_offset, r.msg_ids, r.duplicate, r)

    def _send(self, req: SendRequest) -> Awaitable[SendResponse]:
        """The half send's request (an awaitable: no coroutine of its own in the common case)."""
        if req.properties:
            return self._send_shared(req)
        return self.client.request(RequestCode.SEND_MESSAGE, req, SendResponse, retry=True)

    async def _send_shared(self, req: SendRequest) -> SendResponse:
        """SEND_MESSAGE_SHARED when properties are shared; a broker that predates it refuses the code
        (never stores the messages without them), and this session then sends each message with its
        own copy as SEND_MESSAGE."""
        if not self._shared_refused:
            try:
                return await self.client.request(RequestCode.SEND_MESSAGE_SHARED, req, SendResponse, retry=True)
            except BrokerError as e:
                if e.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                    raise
                log.info("%s does not take shared properties (an older broker): sending them with each "
                         "message", e.broker)
                self._shared_refused = True
        copies = [msgspec.structs.replace(m) for m in req.messages]  # the caller's stay as they are
        share_properties(copies, req.properties)
        req = msgspec.structs.replace(req, properties={}, messages=copies)
        return await self.client.request(RequestCode.SEND_MESSAGE, req, SendResponse, retry=True)

    async def end(self, txn: Prepared | str, state: LocalTransactionState, commit_log_offset: int | None = None,
                  from_check: bool = False) -> EndTransactionResponse:
        """Send the decision for a Prepared (at its offset) or a transaction id (at
        `commit_log_offset`; 0 finds it by id). Idempotent, so retried across reconnects until the
        request timeout; a refusal raises BrokerError."""
        if isinstance(txn, Prepared):
            txid, offset = txn.transaction_id, txn.commit_log_offset
        else:
            txid, offset = txn, 0
        if commit_log_offset is not None:
            offset = commit_log_offset
        return await self._end(txid, state, offset, from_check)

    def _end(self, txid: str, state: LocalTransactionState, offset: int,
             from_check: bool = False) -> Awaitable[EndTransactionResponse]:
        """END_TRANSACTION's request (an awaitable: `finish` awaits it without a coroutine of `end`'s)."""
        return self.client.request(
            RequestCode.END_TRANSACTION, EndTransactionRequest(self.group, txid, state.value, offset, from_check),
            EndTransactionResponse, retry=True)

    async def end_many(self, decisions: Iterable[tuple[Prepared | str, LocalTransactionState]]
                       ) -> list[EndTransactionResponse | ClientError]:
        """Several decisions at once, in flight together on the one connection. Each outcome in the
        order given: the broker's answer, or the ClientError that refused or lost it (one failure
        does not stop the others)."""
        async def one(txn, state):
            try:
                return await self.end(txn, state)
            except ClientError as e:
                return e

        return list(await asyncio.gather(*(one(txn, state) for txn, state in decisions)))

    # ---- a producer's transaction: begin, (the local transaction), finish ---------------------------

    async def begin(self, msgs: list[Message], transaction_id: str | None = None,
                    participants: list[str] | None = None) -> Prepared | TransactionSendResult:
        """The half send of a producer's transaction (the home's, of one spanning `participants`).
        Prepared: stored, run the local transaction and `finish`. A TransactionSendResult: stored
        without the durability asked for, already rolled back; run no local transaction. Other
        refusals raise BrokerError."""
        txid = transaction_id or uuid.uuid4().hex
        try:
            return await self.prepare(msgs, txid, participants=participants)
        except BrokerError as e:
            if e.code not in NOT_STORED_CODES:
                raise
            return await self._roll_back_unstored(e, txid)

    async def finish(self, prepared: Prepared, state: LocalTransactionState,
                     wait_end: bool = True) -> TransactionSendResult:
        """END_TRANSACTION with the local transaction's state (nothing for UNKNOWN: check-back decides).
        A decision that cannot be delivered is reported in `end_error`, not raised. `wait_end=False`
        returns once END_TRANSACTION is on its way, its acknowledgement in `result.ended`: a caller
        that goes on to its next transaction has both requests, and both answers, travel together
        (one round trip a transaction, as RocketMQ's one-way END, still acknowledged)."""
        result = TransactionSendResult("SEND_OK", prepared.transaction_id, prepared.msg_ids, state,
                                       prepared.commit_log_offset)
        if state is LocalTransactionState.UNKNOWN:
            return result
        if wait_end:
            await self._end_into(result, prepared, state)
        else:
            result.ended = asyncio.ensure_future(self._end_into(result, prepared, state))
        return result

    async def _end_into(self, result: TransactionSendResult, prepared: Prepared, state: LocalTransactionState) -> None:
        try:
            r = await self._end(prepared.transaction_id, state, prepared.commit_log_offset)
            result.queue_offsets = r.queue_offsets
        except ClientError as e:
            _warnings.warning("END_TRANSACTION not delivered",
                              "END_TRANSACTION %s for %s not delivered (%s); check-back will resolve it",
                              state.name, prepared.transaction_id, e)
            result.end_error = str(e)

    async def _roll_back_unstored(self, e: BrokerError, txid: str) -> TransactionSendResult:
        _warnings.warning("half message not safely stored", "half message not safely stored (%s): rolling back "
                          "without running the local transaction", e.code_name)
        result = TransactionSendResult(e.code_name, txid, [], LocalTransactionState.ROLLBACK)
        try:
            await self.end(txid, LocalTransactionState.ROLLBACK)
        except BrokerError as end_error:
            # The rollback may itself be "stored on the master only" (same replication state):
            # it is recorded there all the same, so only other refusals are worth reporting.
            if end_error.code not in NOT_STORED_CODES:
                result.end_error = str(end_error)
        except ClientError as end_error:
            result.end_error = str(end_error)
        return result

    async def answer_check(self, txid: str, state: LocalTransactionState, commit_log_offset: int) -> None:
        """A check-back's answer. Never raises: the broker keeps its decision and asks again."""
        try:
            await self.end(txid, state, commit_log_offset, from_check=True)
        except BrokerError as e:
            # Already decided the other way, or gone: the broker keeps its decision; say so.
            _warnings.warning("check-back answer refused", "check-back answer %s for %s refused: %s", state.name,
                              txid, e)
        except ClientError as e:
            _warnings.warning("check-back answer not delivered", "check-back answer for %s not delivered: %s",
                              txid, e)

    # ---- rights ------------------------------------------------------------------------------------

    async def check_group_right(self) -> None:
        """Raise BrokerError (NO_PERMISSION; UNAUTHORIZED without credentials) unless these
        credentials may act for the group; changes nothing on the broker.

        The data plane has no "what may I do" request and the admin API needs the admin right, so
        this asks QUERY_JOB, read-only, for a job name nobody uses: the broker checks the group
        right before it looks, then answers QUERY_NOT_FOUND. (Not an END_TRANSACTION for a made-up
        id: that would be a decision, and one the broker logs as refused.)"""
        try:
            await self.client.request(RequestCode.QUERY_JOB, QueryJobRequest(
                self.group, name=f"rights-check-{uuid.uuid4().hex}"), JobInfo, retry=False)
        except BrokerError as e:
            if e.code != ResponseCode.QUERY_NOT_FOUND:
                raise
