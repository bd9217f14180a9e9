"""The transactional producer and its TransactionSession against a fake broker: half sends the broker
stored without the durability asked for roll back without running the local transaction, other
refusals raise, a listener's exception counts as UNKNOWN, check-backs run on a bounded worker pool
behind a bounded queue, and the session's prepare / end / end_many / rights check send what they say.

The real broker never answers FLUSH_DISK_TIMEOUT, so these tests use a minimal fake that speaks the
real framing and bodies (protocol/framing.py, protocol/bodies.py) on a loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

import pytest

from txbroker.client import background
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import BrokerError
from txbroker.client.transaction import (
    AsyncTransactionProducer, LocalTransactionState, TransactionListener, TransactionProducer,
)
from txbroker.client.transaction_session import (
    Prepared, TransactionSession, local_decision, local_decision_async,
)
from txbroker.protocol.bodies import (
    CheckTransactionStateRequest, EndTransactionRequest, EndTransactionResponse, ErrorBody, HeartbeatResponse, Message,
    MessageExt, QueryJobRequest, SendRequest, SendResponse, decode, encode,
)
from txbroker.protocol.names import PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED
from txbroker.protocol.codes import RequestCode, ResponseCode, TransactionState
from txbroker.protocol.framing import FLAG_ONEWAY, FLAG_RESPONSE, Frame, FrameDecoder, encode_frame

GROUP = "tx-group"
NOT_STORED = [ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE]


def _reply(frame: Frame, code: int, body) -> bytes:
    return encode_frame(FLAG_RESPONSE, code, frame.opaque, encode(body))


class FakeBroker:
    """A master that refuses every SEND_MESSAGE with `send_code` (SUCCESS: stores it, at commit log
    offset 1000 + n), records and accepts every END_TRANSACTION (but refuses those of `refuse_ends`
    with QUERY_NOT_FOUND), answers QUERY_JOB with `query_code`, and can push CHECK_TRANSACTION_STATE
    to the client that connected last."""

    def __init__(self, send_code: ResponseCode = ResponseCode.MESSAGE_ILLEGAL):
        self.send_code = send_code
        self.sends: list[SendRequest] = []
        self.ends: list[EndTransactionRequest] = []
        self.refuse_ends: set[str] = set()
        self.queries: list[QueryJobRequest] = []
        self.query_code = ResponseCode.QUERY_NOT_FOUND
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> "FakeBroker":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = "127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self._server.close()
        for w in self._writers:
            w.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        frames = FrameDecoder(1 << 20)
        try:
            while data := await reader.read(65536):
                for frame in frames.feed(data):
                    assert isinstance(frame, Frame), frame
                    writer.write(self._answer(frame))
        except ConnectionError:
            pass

    def _answer(self, frame: Frame) -> bytes:
        if frame.code == RequestCode.HEARTBEAT:
            return _reply(frame, ResponseCode.SUCCESS, HeartbeatResponse("fake", "master", epoch=1))
        if frame.code == RequestCode.SEND_MESSAGE:
            req = decode(SendRequest, frame.body)
            self.sends.append(req)
            if self.send_code != ResponseCode.SUCCESS:
                return _reply(frame, self.send_code, ErrorBody(f"fake broker refuses: {self.send_code.name}"))
            return _reply(frame, ResponseCode.SUCCESS, SendResponse(
                [f"msg-{len(self.sends)}-{i}" for i in range(len(req.messages))], transaction_id=req.transaction_id,
                commit_log_offset=1000 + len(self.sends)))
        if frame.code == RequestCode.END_TRANSACTION:
            req = decode(EndTransactionRequest, frame.body)
            self.ends.append(req)
            if req.transaction_id in self.refuse_ends:
                return _reply(frame, ResponseCode.QUERY_NOT_FOUND, ErrorBody(f"no transaction {req.transaction_id}"))
            return _reply(frame, ResponseCode.SUCCESS, EndTransactionResponse(req.state, queue_offsets=[7]))
        if frame.code == RequestCode.QUERY_JOB:
            self.queries.append(decode(QueryJobRequest, frame.body))
            return _reply(frame, self.query_code, ErrorBody(f"fake broker answers {self.query_code.name}"))
        return _reply(frame, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, ErrorBody(f"code {frame.code}"))

    def send_checks(self, txids: list[str]) -> None:
        """One-way check-backs, as check_service.py sends them, all in a single write."""
        self._writers[-1].write(b"".join(encode_frame(FLAG_ONEWAY, RequestCode.CHECK_TRANSACTION_STATE, 0, encode(
            CheckTransactionStateRequest(GROUP, txid, 1000 + i, MessageExt(
                f"msg-{i}", "orders", 0, 0, b"half", properties={PROPERTY_TRANSACTION_PREPARED: "true",
                                                                 PROPERTY_PRODUCER_GROUP: GROUP}))))
            for i, txid in enumerate(txids)))


class Listener(TransactionListener):
    """Counts local transactions; check-backs block on `release` and record their concurrency."""

    def __init__(self):
        self.executed = []
        self.release = threading.Event()
        self.cond = threading.Condition()
        self.running = 0
        self.max_running = 0
        self.started = 0
        self.threads: set[int] = set()

    def execute_local_transaction(self, msg, arg):
        self.executed.append(msg)
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg):
        with self.cond:
            self.running += 1
            self.started += 1
            self.max_running = max(self.max_running, self.running)
            self.threads.add(threading.get_ident())
            self.cond.notify_all()
        try:
            assert self.release.wait(30), "the test never released the check-backs"
            return LocalTransactionState.COMMIT
        finally:
            with self.cond:
                self.running -= 1
                self.cond.notify_all()

    async def wait_for(self, predicate, timeout: float) -> bool:
        """Wait, without blocking the event loop, until `predicate()` holds; False on timeout."""
        def wait():
            with self.cond:
                return self.cond.wait_for(predicate, timeout)
        return await asyncio.to_thread(wait)


async def until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def fake_broker(send_code: ResponseCode = ResponseCode.MESSAGE_ILLEGAL, release=None):
    """A started FakeBroker, stopped on the way out, after releasing any check-backs still blocked."""
    fake = await FakeBroker(send_code).start()
    try:
        yield fake
    finally:
        if release is not None:
            release.set()
        await fake.stop()


def dropped(caplog) -> list:
    """The check-backs the producer dropped because its queue was full (it logs each one)."""
    return [r for r in caplog.records if "check-back queue full" in r.getMessage()]


def _rolled_back_once(fake: FakeBroker, txid: str) -> None:
    assert [(e.transaction_id, e.state, e.from_transaction_check) for e in fake.ends] == [
        (txid, TransactionState.ROLLBACK, False)]


# ---- half sends not safely stored ------------------------------------------------------------------


@pytest.mark.parametrize("code", NOT_STORED, ids=lambda c: c.name)
def test_not_stored_half_send_rolls_back_without_local_transaction(code):
    listener = Listener()

    async def scenario():
        async with fake_broker(code) as fake, \
                AsyncTransactionProducer(GROUP, fake.address, listener, request_timeout=5) as producer:
            result = await producer.send_message_in_transaction(Message("orders", b"x"), transaction_id="tx-1")
        return fake, result

    fake, result = asyncio.run(scenario())
    assert result.send_status == code.name
    assert result.local_state is LocalTransactionState.ROLLBACK
    assert result.transaction_id == "tx-1" and result.msg_ids == [] and result.end_error == ""
    assert listener.executed == []
    _rolled_back_once(fake, "tx-1")


def test_not_stored_half_send_rolls_back_with_the_blocking_producer():
    listener = Listener()
    fake = background.run(FakeBroker(ResponseCode.FLUSH_DISK_TIMEOUT).start())
    try:
        with TransactionProducer(GROUP, fake.address, listener, request_timeout=5) as producer:
            result = producer.send_message_in_transaction(Message("orders", b"x"), transaction_id="tx-b")
    finally:
        background.run(fake.stop())
    assert result.send_status == "FLUSH_DISK_TIMEOUT"
    assert result.local_state is LocalTransactionState.ROLLBACK
    assert listener.executed == []
    _rolled_back_once(fake, "tx-b")


def test_other_refusal_raises_and_sends_no_decision():
    listener = Listener()

    async def scenario():
        async with fake_broker(ResponseCode.MESSAGE_ILLEGAL) as fake, \
                AsyncTransactionProducer(GROUP, fake.address, listener, request_timeout=5) as producer:
            with pytest.raises(BrokerError) as raised:
                await producer.send_message_in_transaction(Message("orders", b"x"), transaction_id="tx-2")
        return fake, raised.value

    fake, error = asyncio.run(scenario())
    assert error.code == ResponseCode.MESSAGE_ILLEGAL
    assert "MESSAGE_ILLEGAL" in str(error) and error.request == "SEND_MESSAGE"
    assert listener.executed == []
    assert fake.ends == []


# ---- check-backs -----------------------------------------------------------------------------------

CHECKS = [f"check-{i}" for i in range(8)]


def test_check_backs_run_on_a_bounded_pool():
    listener = Listener()

    async def scenario():
        async with fake_broker(release=listener.release) as fake, \
                AsyncTransactionProducer(GROUP, fake.address, listener, check_workers=2):
            fake.send_checks(CHECKS)
            assert await listener.wait_for(lambda: listener.running >= 2, 10), "2 check-backs never ran at once"
            # A larger pool would start a third while the first two block: give it the chance.
            assert not await listener.wait_for(lambda: listener.running > 2, 0.3)
            listener.release.set()
            await until(lambda: len(fake.ends) == len(CHECKS), "every check-back answered")
        return fake

    fake = asyncio.run(scenario())
    assert listener.max_running == 2
    assert len(listener.threads) == 2
    assert listener.started == len(CHECKS)
    assert sorted(e.transaction_id for e in fake.ends) == sorted(CHECKS)
    assert all(e.from_transaction_check and e.state == TransactionState.COMMIT for e in fake.ends)
    assert {e.transaction_id: e.commit_log_offset for e in fake.ends} == {t: 1000 + i for i, t in enumerate(CHECKS)}


def test_check_backs_beyond_the_queue_are_dropped(caplog):
    listener = Listener()
    caplog.set_level(logging.WARNING, logger="txbroker.client.transaction")

    async def scenario():
        async with fake_broker(release=listener.release) as fake, \
                AsyncTransactionProducer(GROUP, fake.address, listener, check_workers=4, check_queue=3):
            fake.send_checks(CHECKS)
            # Run (blocked, holding their slots) or dropped: every check is accounted for.
            await until(lambda: listener.started + len(dropped(caplog)) >= len(CHECKS), "every check run or dropped")
            assert (listener.started, len(dropped(caplog))) == (3, 5)
            listener.release.set()
            await until(lambda: len(fake.ends) == 3, "the accepted check-backs answered")
        return fake

    fake = asyncio.run(scenario())
    assert listener.started == 3
    assert len(fake.ends) == 3
    assert all(e.from_transaction_check for e in fake.ends)
    answered = {e.transaction_id for e in fake.ends}
    dropped_ids = {r.getMessage().split("dropping the check of ")[1].split()[0] for r in dropped(caplog)}
    assert answered | dropped_ids == set(CHECKS)


def test_async_check_backs_have_the_same_bounds(caplog):
    """An `async def` check_local_transaction runs on the producer's loop, not the thread pool, but
    within the same limits: check_workers at once, check_queue in all, the rest dropped."""
    caplog.set_level(logging.WARNING, logger="txbroker.client.transaction")
    release = asyncio.Event()
    seen = {"running": 0, "max": 0, "started": 0}

    class AsyncListener(Listener):
        async def check_local_transaction(self, msg):
            seen["started"] += 1
            seen["running"] += 1
            seen["max"] = max(seen["max"], seen["running"])
            try:
                await release.wait()
                return LocalTransactionState.COMMIT
            finally:
                seen["running"] -= 1

    async def scenario():
        async with fake_broker(release=release) as fake, \
                AsyncTransactionProducer(GROUP, fake.address, AsyncListener(), check_workers=2, check_queue=3):
            fake.send_checks(CHECKS)
            await until(lambda: seen["running"] == 2 and len(dropped(caplog)) == 5, "2 running, 5 dropped")
            release.set()
            await until(lambda: len(fake.ends) == 3, "the accepted check-backs answered")
        return fake

    fake = asyncio.run(scenario())
    assert (seen["started"], seen["max"]) == (3, 2)
    assert all(e.from_transaction_check and e.state == TransactionState.COMMIT for e in fake.ends)


# ---- a listener's answer -----------------------------------------------------------------------------

class _Boom(Exception):
    pass


def _raises(*args):
    raise _Boom("the local transaction failed")


@pytest.mark.parametrize("call, expected", [
    (lambda: LocalTransactionState.COMMIT, LocalTransactionState.COMMIT),
    (lambda: LocalTransactionState.ROLLBACK, LocalTransactionState.ROLLBACK),
    (_raises, LocalTransactionState.UNKNOWN),
    (lambda: None, LocalTransactionState.UNKNOWN),
    (lambda: "COMMIT", LocalTransactionState.UNKNOWN),  # not a LocalTransactionState
], ids=["commit", "rollback", "raises", "none", "other"])
def test_local_decision_counts_an_exception_none_or_anything_else_as_unknown(call, expected):
    assert local_decision("execute_local_transaction", "tx", call) is expected
    assert asyncio.run(local_decision_async("execute_local_transaction", "tx", call)) is expected

    async def async_call():
        return call()

    assert asyncio.run(local_decision_async("check_local_transaction", "tx", async_call)) is expected


def test_a_raising_listener_leaves_the_decision_to_check_back_in_both_producers():
    """Its exception counts as UNKNOWN: the half message stays, no END_TRANSACTION is sent."""
    class Raising(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            raise _Boom("local transaction failed")

    class AsyncRaising(TransactionListener):
        async def execute_local_transaction(self, msg, arg):
            raise _Boom("local transaction failed")

    async def scenario(listener):
        async with fake_broker(ResponseCode.SUCCESS) as fake, \
                AsyncTransactionProducer(GROUP, fake.address, listener, request_timeout=5) as producer:
            return fake, await producer.send_message_in_transaction(Message("orders", b"x"), transaction_id="tx-a")

    for listener in (Raising(), AsyncRaising()):
        fake, result = asyncio.run(scenario(listener))
        assert (result.send_status, result.local_state, result.transaction_id) == (
            "SEND_OK", LocalTransactionState.UNKNOWN, "tx-a")
        assert [s.transaction_id for s in fake.sends] == ["tx-a"] and fake.ends == []

    fake = background.run(FakeBroker(ResponseCode.SUCCESS).start())
    try:
        with TransactionProducer(GROUP, fake.address, Raising(), request_timeout=5) as producer:
            result = producer.send_message_in_transaction(Message("orders", b"x"), transaction_id="tx-b")
    finally:
        background.run(fake.stop())
    assert (result.send_status, result.local_state, result.msg_ids) == (
        "SEND_OK", LocalTransactionState.UNKNOWN, ["msg-1-0"])
    assert fake.ends == []


def test_a_committed_local_transaction_ends_at_the_half_messages_offset():
    listener = Listener()
    fake = background.run(FakeBroker(ResponseCode.SUCCESS).start())
    try:
        with TransactionProducer(GROUP, fake.address, listener, request_timeout=5) as producer:
            msg = Message("orders", b"x")
            result = producer.send_message_in_transaction(msg, transaction_id="tx-c")
    finally:
        background.run(fake.stop())
    assert listener.executed == [msg] and msg.transaction_id == "tx-c"  # the listener sees the id
    assert (result.local_state, result.commit_log_offset, result.queue_offsets) == (
        LocalTransactionState.COMMIT, 1001, [7])
    assert [(e.transaction_id, e.state, e.commit_log_offset, e.from_transaction_check) for e in fake.ends] == [
        ("tx-c", TransactionState.COMMIT, 1001, False)]


# ---- the session on its own ----------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def session_on(fake: FakeBroker, group: str = GROUP):
    """A TransactionSession over a client that registers nothing (as a Spark task's)."""
    client = BrokerClient(fake.address, request_timeout=5)
    try:
        yield TransactionSession(client, group)
    finally:
        await client.close()


def test_session_prepares_into_a_job_and_ends_by_handle_or_id():
    async def scenario():
        async with fake_broker(ResponseCode.SUCCESS) as fake, session_on(fake) as session:
            msgs = [Message("orders", b"a"), Message("orders", b"b")]
            half = await session.prepare(msgs, "tx-1", job_id="job-7")
            plain = await session.prepare([Message("orders", b"c")])
            ends = [await session.end(half, LocalTransactionState.COMMIT),
                    await session.end(plain.transaction_id, LocalTransactionState.ROLLBACK)]
            return fake, msgs, half, plain, ends

    fake, msgs, half, plain, ends = asyncio.run(scenario())
    assert half == Prepared("tx-1", 1001, ["msg-1-0", "msg-1-1"])
    assert half.response.commit_log_offset == 1001 and {m.transaction_id for m in msgs} == {"tx-1"}
    assert len(plain.transaction_id) == 32 and plain.commit_log_offset == 1002  # a new id when none is given
    assert [(s.producer_group, s.transaction_id, s.job_id) for s in fake.sends] == [
        (GROUP, "tx-1", "job-7"), (GROUP, plain.transaction_id, "")]
    assert [(e.transaction_id, e.state, e.commit_log_offset) for e in fake.ends] == [
        ("tx-1", TransactionState.COMMIT, 1001), (plain.transaction_id, TransactionState.ROLLBACK, 0)]
    assert [e.state for e in ends] == [TransactionState.COMMIT, TransactionState.ROLLBACK]


def test_session_end_many_reports_each_outcome_and_one_refusal_stops_nothing():
    async def scenario():
        async with fake_broker(ResponseCode.SUCCESS) as fake, session_on(fake) as session:
            fake.refuse_ends.add("gone")
            half = await session.prepare([Message("orders", b"a")], "kept")
            outcomes = await session.end_many([(half, LocalTransactionState.COMMIT),
                                               ("gone", LocalTransactionState.ROLLBACK),
                                               ("other", LocalTransactionState.ROLLBACK)])
            return fake, outcomes

    fake, outcomes = asyncio.run(scenario())
    assert [type(o).__name__ for o in outcomes] == ["EndTransactionResponse", "BrokerError", "EndTransactionResponse"]
    assert outcomes[1].code == ResponseCode.QUERY_NOT_FOUND and outcomes[1].request == "END_TRANSACTION"
    assert sorted((e.transaction_id, e.commit_log_offset) for e in fake.ends) == [
        ("gone", 0), ("kept", 1001), ("other", 0)]


def test_session_rights_check_is_a_read_only_query_for_the_group():
    """QUERY_NOT_FOUND: the broker checked the group right, then found nothing: allowed. NO_PERMISSION
    raises. Either way nothing is prepared or ended."""
    async def scenario():
        async with fake_broker(ResponseCode.SUCCESS) as fake, session_on(fake, "spark-pg") as session:
            await session.check_group_right()
            fake.query_code = ResponseCode.NO_PERMISSION
            with pytest.raises(BrokerError) as refused:
                await session.check_group_right()
            return fake, refused.value

    fake, refused = asyncio.run(scenario())
    assert refused.code == ResponseCode.NO_PERMISSION and refused.request == "QUERY_JOB"
    assert [q.producer_group for q in fake.queries] == ["spark-pg", "spark-pg"]
    assert all(q.name and not q.job_id for q in fake.queries)
    assert fake.sends == [] and fake.ends == []


def test_only_the_session_builds_half_sends_and_decisions():
    """The producers and the Spark data source go through TransactionSession: none of them builds a
    transactional SEND_MESSAGE or an END_TRANSACTION by hand."""
    from tests.conftest import REPO

    users = [REPO / "broker_image" / "txbroker" / "client" / "transaction.py",
             *sorted((REPO / "spark" / "txbroker_spark").glob("*.py"))]
    assert len(users) > 10
    by_hand = [f.name for f in users if any(s in f.read_text() for s in (
        "RequestCode.END_TRANSACTION", "EndTransactionRequest(", "RequestCode.SEND_MESSAGE", "SendRequest("))]
    assert by_hand == []
