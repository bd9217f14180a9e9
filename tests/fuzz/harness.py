"""What the fuzzers (atheris, tests/fuzz/fuzz_*.py) and the property tests (hypothesis,
tests/unit/test_fuzz_*.py) drive: the frame decoder and body decoders, and a real in-process
broker's request handlers reached through a BrokerConnection on a fake transport.

The property checked on the handlers: whatever arrives, every answer is a well-formed frame, no
exception escapes the connection, and no request is answered SYSTEM_ERROR ("failed on the broker")
- that answer means a handler raised something it did not expect, i.e. a bug. The broker must
still answer a good request afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time

import msgspec

from txbroker.broker.auth import hash_secret
from txbroker.broker.config import load_config
from txbroker.broker.connection import BrokerConnection
from txbroker.broker.server import Broker
from txbroker.protocol import bodies
from txbroker.protocol.bodies import ErrorBody, HeartbeatRequest, decode, encode
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.framing import Frame, FrameDecoder, FrameError, encode_frame

# Request code -> body type, for building structured inputs.
REQUEST_BODIES: dict[int, type] = {
    RequestCode.SEND_MESSAGE: bodies.SendRequest,
    RequestCode.SEND_MESSAGE_SHARED: bodies.SendRequest,
    RequestCode.END_TRANSACTION: bodies.EndTransactionRequest,
    RequestCode.PULL_MESSAGE: bodies.PullRequest,
    RequestCode.HEARTBEAT: bodies.HeartbeatRequest,
    RequestCode.UNREGISTER_CLIENT: bodies.ConsumerListRequest,
    RequestCode.GET_ROUTEINFO_BY_TOPIC: bodies.RouteRequest,
    RequestCode.UPDATE_AND_CREATE_TOPIC: bodies.CreateTopicRequest,
    RequestCode.VIEW_MESSAGE_BY_ID: bodies.ViewMessageRequest,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: bodies.ConsumerListRequest,
    RequestCode.UPDATE_CONSUMER_OFFSET: bodies.CommitOffsetsRequest,
    RequestCode.QUERY_CONSUMER_OFFSET: bodies.QueryOffsetsRequest,
    RequestCode.CONSUMER_SEND_MSG_BACK: bodies.SendBackRequest,
    RequestCode.LOCK_BATCH_MQ: bodies.LockQueuesRequest,
    RequestCode.UNLOCK_BATCH_MQ: bodies.LockQueuesRequest,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: bodies.SearchOffsetRequest,
    RequestCode.QUERY_MESSAGE: bodies.QueryByKeyRequest,
    RequestCode.REPLICATION_SUBSCRIBE: bodies.ReplicaSubscribe,
    RequestCode.REPLICATION_ACK: bodies.ReplicaAck,
    RequestCode.SASL_AUTHENTICATE: bodies.SaslRequest,
    RequestCode.OPEN_JOB: bodies.OpenJobRequest,
    RequestCode.PREPARE_JOB: bodies.PrepareJobRequest,
    RequestCode.DECIDE_JOB: bodies.DecideJobRequest,
    RequestCode.QUERY_JOB: bodies.QueryJobRequest,
    RequestCode.QUERY_JOB_MEMBERS: bodies.JobMembersRequest,
    RequestCode.QUERY_JOBS_SETTLED: bodies.JobsSettledRequest,
    RequestCode.QUERY_TRANSACTION_STATES: bodies.TransactionStatesRequest,
    RequestCode.REPLICATION_SNAPSHOT: bodies.SnapshotRequest,
}
ALL_BODY_TYPES = sorted({t for t in vars(bodies).values()
                         if isinstance(t, type) and issubclass(t, msgspec.Struct) and t is not msgspec.Struct},
                        key=lambda t: t.__name__)
MAX_WAIT_MS = 50  # long polls in fuzzed requests are cut to this, so an input settles quickly


# ---- decoders ----------------------------------------------------------------------------------------

def decode_stream(data: bytes, chunks: list[int], max_frame: int = 4096) -> list[Frame | FrameError]:
    """Feed `data` to a FrameDecoder in chunks of the given sizes (the rest at once); check what
    comes out is only frames and errors, and nothing after a fatal error."""
    dec = FrameDecoder(max_frame)
    out: list[Frame | FrameError] = []
    pos = 0
    for n in chunks + [len(data)]:
        piece = data[pos:pos + max(n, 1)]
        pos += len(piece)
        got = dec.feed(piece)
        for item in got:
            assert type(item) in (Frame, FrameError), item
            if isinstance(item, Frame):
                assert len(item.body) + 12 <= max_frame, "a frame above the maximum came out"
        out.extend(got)
        if pos >= len(data):
            break
    fatal = [i for i, item in enumerate(out) if isinstance(item, FrameError) and item.fatal]
    assert not fatal or fatal[0] == len(out) - 1, "frames decoded after a fatal error"
    return out


def decode_body_any(data: bytes) -> None:
    """Every body decoder either decodes `data` or raises msgspec's DecodeError/ValidationError."""
    for kind in ALL_BODY_TYPES:
        try:
            value = decode(kind, data)
        except bodies.BODY_ERRORS:  # msgspec's (ValidationError included), and UnicodeDecodeError
            continue
        assert decode(kind, encode(value)) == value, f"{kind.__name__} does not round-trip"


# ---- an in-process broker on a fake transport ----------------------------------------------------------

class FakeTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data) -> None:
        if not self.closed:  # writes after close are dropped, as asyncio does
            self.out += data

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 9)}.get(name, default)


class InProcessBroker:
    """A real Broker (RocksDB in a temporary directory, ASYNC flush) on its own event loop, with
    authentication on: connections can be made authenticated as an admin (every handler reachable)
    or left unauthenticated (the admission and SASL paths)."""

    def __init__(self, auth: bool = True, config: dict | None = None):
        # Refusals are expected here; the level goes back on close (other tests in the process read logs).
        self._log_level = logging.getLogger("txbroker").level
        logging.getLogger("txbroker").setLevel(logging.CRITICAL)
        self.dir = tempfile.mkdtemp(prefix="txbroker-fuzz-")
        overrides = {"data_dir": self.dir + "/data", "listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
                     "max_message_size": 4096, "max_unacked_bytes": 1 << 20, "log_level": "CRITICAL",
                     **(config or {})}
        if auth:
            path = self.dir + "/credentials.toml"
            with open(path, "w") as f:
                f.write('[[users]]\naccess_key = "root"\nscram = "%s"\nadmin = true\n'
                        '[[users]]\naccess_key = "app"\nscram = "%s"\ntopics = ["T*=PUB|SUB"]\n'
                        'producer_groups = ["pg"]\nconsumer_groups = ["cg"]\n'
                        % (hash_secret("root").encode(), hash_secret("app").encode()))
            overrides["auth_file"] = path
        self.loop = asyncio.new_event_loop()
        self.broker = self.loop.run_until_complete(self._start(load_config(None, overrides)))
        self.run(self._seed())

    async def _start(self, config) -> Broker:
        b = Broker(config)
        await b.start()
        return b

    async def _seed(self) -> None:
        """Some state for requests to find: topics, a message, a pending transaction."""
        root = self.broker.auth.lookup("root") if self.broker.auth else None
        conn, t = self.connect(root)
        for code, body in ((RequestCode.SEND_MESSAGE, bodies.SendRequest("pg", [bodies.Message("T", b"x")])),
                           (RequestCode.SEND_MESSAGE, bodies.SendRequest("pg", [bodies.Message("T", b"y")], "tx1")),
                           (RequestCode.UPDATE_AND_CREATE_TOPIC, bodies.CreateTopicRequest("T2", 2))):
            conn.data_received(encode_frame(0, code, 1, encode(body)))
        await self.settle(conn)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def connect(self, principal=None) -> tuple[BrokerConnection, FakeTransport]:
        conn = BrokerConnection(self.broker)
        t = FakeTransport()
        conn.connection_made(t)
        if principal is not None:
            conn.authenticated(principal)
        return conn, t

    async def settle(self, conn: BrokerConnection, timeout: float = 2.0) -> None:
        """Let the connection's requests finish (group commits, short long-polls)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(0.001)
            if conn.quiet:
                break
        await asyncio.sleep(0)

    def feed(self, chunks: list[bytes], authenticated: bool) -> list[Frame | FrameError]:
        """Feed a connection, let it settle, check the answers, close it; returns the answers."""
        return self.run(self._feed(chunks, authenticated))

    async def _feed(self, chunks: list[bytes], authenticated: bool) -> list[Frame | FrameError]:
        root = self.broker.auth.lookup("root") if authenticated and self.broker.auth else None
        conn, t = self.connect(root)
        for chunk in chunks:
            conn.data_received(chunk)
        await self.settle(conn)
        conn.connection_lost(None)
        answers = FrameDecoder(64 << 20).feed(bytes(t.out))
        check_answers(answers)
        return answers

    def still_serves(self) -> bool:
        return self.run(self._still_serves())

    async def _still_serves(self) -> bool:
        conn, t = self.connect(self.broker.auth.lookup("root") if self.broker.auth else None)
        conn.data_received(encode_frame(0, RequestCode.HEARTBEAT, 7, encode(HeartbeatRequest("probe"))))
        await self.settle(conn)
        conn.connection_lost(None)
        (answer,) = FrameDecoder(1 << 20).feed(bytes(t.out))
        return answer.code == ResponseCode.SUCCESS and answer.opaque == 7

    def close(self) -> None:
        self.run(self.broker.stop())
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        logging.getLogger("txbroker").setLevel(self._log_level)


def check_answers(answers) -> None:
    for a in answers:
        assert isinstance(a, Frame), f"the broker wrote an undecodable frame: {a}"
        assert a.is_response or a.is_oneway, a
        if a.is_response and a.code != ResponseCode.SUCCESS:
            remark = decode(ErrorBody, a.body).remark
            assert a.code != ResponseCode.SYSTEM_ERROR, f"a handler failed on fuzzed input: {remark}"


def cut_long_polls(code: int, body: bytes) -> bytes:
    """Fuzzed long polls would hold a request up to 60 s: cut their wait (a structured body only)."""
    if code != RequestCode.PULL_MESSAGE:
        return body
    try:
        req = decode(bodies.PullRequest, body)
    except bodies.BODY_ERRORS:
        return body
    if req.max_wait_ms > MAX_WAIT_MS:
        req.max_wait_ms = MAX_WAIT_MS
        return encode(req)
    return body


__all__ = ["ALL_BODY_TYPES", "InProcessBroker", "REQUEST_BODIES", "check_answers", "cut_long_polls",
           "decode_body_any", "decode_stream"]
