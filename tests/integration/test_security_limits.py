"""Limits: each one hit answers with the right code and a remark naming the limit, while other
clients keep working; a client that stops reading does not stall the broker; idle connections
expire; too many requests in flight on one connection is backpressure, not an error."""

from __future__ import annotations

import socket

import pytest

from support.metrics import metric
from support.waiting import wait_until
from txbroker.client import (
    BrokerError, BrokerUnavailable, LocalTransactionState as S, Message, Producer, PullConsumer, TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient
from txbroker.protocol.bodies import (
    ErrorBody, HeartbeatRequest, PullRequest, SendRequest, SendResponse, ViewMessageRequest, decode, encode,
)
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.framing import FrameDecoder, encode_frame


class RawClient:
    def __init__(self, address, rcvbuf: int | None = None):
        host, port = address.split(":")
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(15)
        self.sock.connect((host, int(port)))
        self.dec = FrameDecoder(64 << 20)
        self.frames: list = []

    def send(self, code, body, opaque=1):
        self.sock.sendall(encode_frame(0, code, opaque, encode(body)))

    def answer(self):
        while not self.frames:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by the broker")
            self.frames.extend(self.dec.feed(data))
        return self.frames.pop(0)

    def closed_by_peer(self) -> bool:
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    return True
        except ConnectionResetError:
            return True


def remark(frame) -> str:
    return decode(ErrorBody, frame.body).remark


def connections(broker) -> list[dict]:
    return AdminClient(broker.admin_url, timeout=5).get("/api/v1/connections")["connections"]


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return S.COMMIT

    def check_local_transaction(self, msg):
        return S.COMMIT


def test_max_connections(broker_factory):
    b = broker_factory("--max-connections", "2")
    with Producer("g", b.address) as p1, Producer("g", b.address) as p2:
        with pytest.raises(BrokerUnavailable) as e:
            Producer("g", b.address, request_timeout=10).start()   # refused at once; the timeout only guards a loaded machine
        assert "max_connections reached" in str(e.value) and "2 connections open" in str(e.value)
        raw = RawClient(b.address)
        f = raw.answer()  # told at once, on a connection-level answer (opaque 0), then closed
        assert (f.code, f.opaque) == (ResponseCode.SYSTEM_BUSY, 0) and "max_connections reached" in remark(f)
        assert raw.closed_by_peer()
        assert p1.send(Message("T", b"1")).msg_ids and p2.send(Message("T", b"2")).msg_ids  # others go on
    assert metric(b, "txbroker_limit_refusals_total", limit="max_connections") >= 2

    def a_new_one_gets_in():
        try:
            with Producer("g", b.address, request_timeout=5) as p:
                return bool(p.send(Message("T", b"3")).msg_ids)
        except BrokerUnavailable:
            return False
    wait_until(a_new_one_gets_in, what="a connection once others closed")


def test_max_unacked_bytes_across_connections(broker_factory):
    # Long polls with large (valid) tag expressions hold their request bytes until answered.
    b = broker_factory("--max-message-size", "1024", "--max-unacked-bytes", "100000")
    AdminClient(b.admin_url).post("/api/v1/topics", {"name": "Empty", "queues": 1})
    big_poll = PullRequest("Empty", 0, 0, 32, 30_000, "", "A" * 60_000)
    holder = RawClient(b.address)
    holder.send(RequestCode.PULL_MESSAGE, big_poll, opaque=1)
    wait_until(lambda: AdminClient(b.admin_url).get("/api/v1/broker")["limits"]["unacked_bytes"] > 60_000,
               what="the first long poll to be held")

    refused = RawClient(b.address)  # another connection: over the budget, answered at once
    refused.send(RequestCode.PULL_MESSAGE, big_poll, opaque=2)
    f = refused.answer()
    assert (f.code, f.opaque) == (ResponseCode.SYSTEM_BUSY, 2)
    assert "max_unacked_bytes reached" in remark(f) and "(limit 100000)" in remark(f)
    assert metric(b, "txbroker_limit_refusals_total", limit="max_unacked_bytes") == 1

    with Producer("g", b.address) as p:  # small requests still fit: other clients keep working
        p.send(Message("Other", b"fine"))
        p.send(Message("Empty", b"wakes the poll", queue_id=0))
    f = holder.answer()
    assert (f.code, f.opaque) == (ResponseCode.SUCCESS, 1)  # the held poll completes normally
    wait_until(lambda: AdminClient(b.admin_url).get("/api/v1/broker")["limits"]["unacked_bytes"] == 0,
               what="the budget to be given back")
    refused.send(RequestCode.PULL_MESSAGE, PullRequest("Empty", 0, 0, 32, 0, "", "A" * 60_000), opaque=3)
    assert refused.answer().code == ResponseCode.SUCCESS  # and now it fits


def test_idle_connections_expire_and_clients_reconnect(broker_factory):
    b = broker_factory("--idle-timeout-ms", "300")
    raw = RawClient(b.address)
    raw.send(RequestCode.HEARTBEAT, HeartbeatRequest("raw"))
    assert raw.answer().code == ResponseCode.SUCCESS
    f = raw.answer()  # said nothing more: told, then closed
    assert (f.code, f.opaque) == (ResponseCode.SERVICE_NOT_AVAILABLE, 0) and "idle_timeout_ms" in remark(f)
    assert raw.closed_by_peer()
    assert metric(b, "txbroker_connections_closed_by_broker_total", reason="idle") >= 1

    with Producer("g", b.address) as p:
        for i in range(3):  # sends at any moment around the close: none is lost or fails
            wait_until(lambda: metric(b, "txbroker_connections_closed_by_broker_total", reason="idle") >= i + 1,
                       what="the idle connection to be closed")
            assert p.send(Message("T", b"%d" % i, queue_id=0)).msg_ids  # reconnects transparently
    with PullConsumer(b.address) as c:  # a long poll in flight is not idle
        assert c.pull("T", 0, 3, wait_ms=1500).messages == []


def test_a_client_that_stops_reading_does_not_stall_the_broker(broker):
    with Producer("g", broker.address) as p:
        big = p.send(Message("Big", b"x" * (1 << 20))).msg_id
    stalled = RawClient(broker.address, rcvbuf=4096)
    for i in range(200):  # 200 MiB of answers asked for, none read
        stalled.send(RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequest(big), opaque=i + 1)

    def stalled_connection():
        for c in connections(broker):
            if c["peer_not_reading"] and c["reading_paused"]:
                return c
        return None
    wait_until(stalled_connection, what="the broker to stop reading from the stalled client")

    with TransactionProducer("pg", broker.address, Commit()) as tx:  # everyone else goes on
        for i in range(20):
            r = tx.send_message_in_transaction(Message("Orders", f"order {i}".encode()))
            assert r.local_state is S.COMMIT and not r.end_error
    with PullConsumer(broker.address) as c:
        assert len(c.read_all("Orders")) == 20
    c = stalled_connection()
    # what the broker holds for it is bounded (its answers wait to be computed, not buffered)
    assert c["write_buffer_bytes"] <= 16 << 20, c


def test_requests_beyond_max_inflight_wait_instead_of_failing(broker_factory):
    b = broker_factory("--max-inflight-per-connection", "4")
    AdminClient(b.admin_url).post("/api/v1/topics", {"name": "Quiet", "queues": 1})
    raw = RawClient(b.address)
    for i in range(20):  # each waits 300 ms for a message that never comes
        raw.send(RequestCode.PULL_MESSAGE, PullRequest("Quiet", 0, 0, 1, 300), opaque=i + 1)
    wait_until(lambda: any(c["requests_in_flight"] == 4 and c["reading_paused"] for c in connections(b)),
               what="the connection to hold 4 requests and stop reading")
    with Producer("g", b.address) as p:
        assert p.send(Message("Other", b"not blocked")).msg_ids
    answers = [raw.answer() for _ in range(20)]
    assert sorted(f.opaque for f in answers) == list(range(1, 21))
    assert all(f.code == ResponseCode.SUCCESS for f in answers)


def test_sends_beyond_max_inflight_are_answered_in_order_as_their_batches_are_written(broker_factory):
    """Held until their batch is written (answered in the call that writes it), the requests past
    the connection's limit are dispatched later, not lost and not answered twice."""
    b = broker_factory("--max-inflight-per-connection", "2")
    AdminClient(b.admin_url).post("/api/v1/topics", {"name": "Piped", "queues": 1})
    raw = RawClient(b.address)
    frames = b"".join(encode_frame(0, RequestCode.SEND_MESSAGE, i + 1,
                                   encode(SendRequest("g", [Message("Piped", b"m%d" % i, queue_id=0)])))
                      for i in range(60))
    raw.sock.sendall(frames)  # one write: most of it waits in the connection's backlog
    answers = [raw.answer() for _ in range(60)]
    assert [f.opaque for f in answers] == list(range(1, 61))
    assert all(f.code == ResponseCode.SUCCESS for f in answers), [decode(ErrorBody, f.body) for f in answers
                                                                   if f.code != ResponseCode.SUCCESS]
    assert [decode(SendResponse, f.body).queue_offsets for f in answers] == [[i] for i in range(60)]
    c = connections(b)
    assert any(x["requests_in_flight"] == 0 and not x["reading_paused"] for x in c), c


def test_oversize_message_names_the_limit_and_is_counted(broker_factory):
    b = broker_factory("--max-message-size", "2048")
    with Producer("g", b.address) as p:
        with pytest.raises(BrokerError) as e:
            p.send(Message("Big", b"x" * 4096))
        assert e.value.code_name == "MESSAGE_ILLEGAL" and "max_message_size 2048" in e.value.remark
        assert p.send(Message("Big", b"small")).msg_ids
    assert metric(b, "txbroker_limit_refusals_total", limit="max_message_size") == 1
