"""Bad input gets a clear error naming what was wrong; the connection or broker survives where
it should, and nothing already stored is harmed."""

import socket

import pytest

from txbroker.client import BrokerError, Message, Producer, PullConsumer
from txbroker.client.admin import AdminClient, AdminError
from txbroker.protocol.bodies import ErrorBody, HeartbeatRequest, decode, encode
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.framing import FrameDecoder, encode_frame


class RawClient:
    def __init__(self, address):
        host, port = address.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.dec = FrameDecoder(64 << 20)

    def send(self, data: bytes):
        self.sock.sendall(data)

    def answer(self):
        while True:
            frames = self.dec.feed(self.sock.recv(65536) or b"")
            if frames:
                return frames[0]

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


@pytest.fixture
def stored(broker):
    with Producer("g", broker.address) as p:
        p.send(Message("Keep", b"already stored", queue_id=0))
    return broker


def still_intact(broker):
    with PullConsumer(broker.address) as c:
        return [m.body for m in c.read_all("Keep")] == [b"already stored"]


def test_oversize_message_is_refused_with_the_limit(broker_factory):
    b = broker_factory("--max-message-size", "2048")
    with Producer("g", b.address) as p:
        with pytest.raises(BrokerError) as e:
            p.send(Message("Big", b"x" * 4096))
        assert e.value.code_name == "MESSAGE_ILLEGAL" and "max_message_size 2048" in e.value.remark
        assert p.send(Message("Big", b"small")).msg_ids  # same connection still works


def test_default_limit_is_4_mib_and_the_error_names_broker_request_and_code(broker):
    with Producer("g", broker.address) as p:
        assert p.send(Message("Big", b"x" * (4 * 1024 * 1024))).msg_ids  # the limit itself is allowed
        with pytest.raises(BrokerError) as e:
            p.send(Message("Big", b"x" * (4 * 1024 * 1024 + 1)))
    assert e.value.code_name == "MESSAGE_ILLEGAL" and "max_message_size 4194304" in e.value.remark
    assert all(part in str(e.value) for part in (broker.address, "SEND_MESSAGE", "MESSAGE_ILLEGAL"))


def test_oversize_frame_is_answered_and_the_connection_goes_on(stored):
    raw = RawClient(stored.address)
    raw.send(encode_frame(0, RequestCode.SEND_MESSAGE, 41, b"\x00" * (4 * 1024 * 1024 + 128 * 1024)))
    f = raw.answer()
    assert (f.code, f.opaque) == (ResponseCode.MESSAGE_ILLEGAL, 41)
    assert "maximum frame size" in decode(ErrorBody, f.body).remark
    raw.send(encode_frame(0, RequestCode.HEARTBEAT, 42, encode(HeartbeatRequest("raw", ["g"]))))
    assert (raw.answer().code, 42) == (ResponseCode.SUCCESS, 42)
    assert still_intact(stored)


def test_malformed_body_names_the_request(stored):
    raw = RawClient(stored.address)
    raw.send(encode_frame(0, RequestCode.SEND_MESSAGE, 7, b"\x93\x01\x02"))
    f = raw.answer()
    assert f.code == ResponseCode.MESSAGE_ILLEGAL
    assert "malformed SEND_MESSAGE request body" in decode(ErrorBody, f.body).remark
    assert still_intact(stored)


def test_unknown_request_code(stored):
    raw = RawClient(stored.address)
    raw.send(encode_frame(0, 9999, 5, b""))
    f = raw.answer()
    assert f.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in decode(ErrorBody, f.body).remark
    raw.send(encode_frame(0, RequestCode.HEARTBEAT, 6, encode(HeartbeatRequest("raw", ["g"]))))
    assert (raw.answer().code, 6) == (ResponseCode.SUCCESS, 6)  # the connection goes on
    assert still_intact(stored)


def test_garbage_stream_is_closed_but_the_broker_serves_others(stored):
    raw = RawClient(stored.address)
    raw.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    f = raw.answer()
    assert f.code == ResponseCode.MESSAGE_ILLEGAL
    assert raw.closed_by_peer()
    assert still_intact(stored)


def test_truncated_frame_then_disconnect_harms_nothing(stored):
    raw = RawClient(stored.address)
    frame = encode_frame(0, RequestCode.SEND_MESSAGE, 1, encode(["g", [["Keep", b"half"]]]))
    raw.send(frame[:-3])
    raw.sock.close()
    assert still_intact(stored)


@pytest.mark.parametrize("topic", ["bad topic", "", "x" * 200, "tópico"])
def test_invalid_topic_names(broker, topic):
    with Producer("g", broker.address) as p:
        with pytest.raises(BrokerError) as e:
            p.send(Message(topic, b"x"))
    assert e.value.code_name == "MESSAGE_ILLEGAL" and "invalid topic name" in e.value.remark


def test_system_topics_cannot_be_written(broker):
    with Producer("g", broker.address) as p:
        with pytest.raises(BrokerError) as e:
            p.send(Message("RMQ_SYS_TRANS_HALF_TOPIC", b"x"))
    assert e.value.code_name == "NO_PERMISSION"


def test_topic_must_exist_when_auto_create_is_off(broker_factory):
    b = broker_factory("--no-auto-create-topic")
    with Producer("g", b.address) as p:
        with pytest.raises(BrokerError) as e:
            p.send(Message("Missing", b"x"))
        assert e.value.code_name == "TOPIC_NOT_EXIST"
        AdminClient(b.admin_url).post("/api/v1/topics", {"name": "Missing", "queues": 2})
        with pytest.raises(BrokerError) as e:
            p.send(Message("Missing", b"x", queue_id=5))
        assert "topic Missing has 2 queues" in e.value.remark
        assert p.send(Message("Missing", b"x", queue_id=1)).queue_ids == [1]


def test_pull_errors(broker):
    with Producer("g", broker.address) as p:
        p.send(Message("PullMe", b"x", queue_id=0))
    with PullConsumer(broker.address) as c:
        with pytest.raises(BrokerError) as e:
            c.pull("NoSuchTopic", 0, 0)
        assert e.value.code_name == "TOPIC_NOT_EXIST"
        with pytest.raises(BrokerError) as e:
            c.pull("PullMe", 0, 99)
        assert e.value.code_name == "PULL_OFFSET_MOVED" and "beyond the end" in e.value.remark


def test_admin_api_rejects_bad_json_and_values(broker):
    admin = AdminClient(broker.admin_url)
    with pytest.raises(AdminError, match="check_max must be between"):
        admin.put("/api/v1/config/transaction", {"check_max": 0})
    with pytest.raises(AdminError, match="no transaction"):
        admin.post("/api/v1/transactions/nope/commit")
    with pytest.raises(AdminError, match="20 hex digits"):
        admin.get("/api/v1/messages/xyz")


@pytest.mark.parametrize("value", ["30s", "-5", "nan", "inf", "1e400", "", " ", "9" * 40])
def test_a_malformed_immunity_is_refused_before_anything_is_written(broker_factory, value):
    """Second review, defect 5: a half message with CHECK_IMMUNITY_TIME_IN_SECONDS="30s" got
    SYSTEM_ERROR, but its record was already in the write batch and the log end had moved;
    replication never sent it, the slave still looked in sync, and every later SYNC write timed out
    (FLUSH_SLAVE_TIMEOUT): any producer could stall the group."""
    import asyncio

    from support.pairs import sync_pair
    from txbroker.client import AsyncTransactionProducer

    m, s = sync_pair(broker_factory)
    end_before = AdminClient(m.admin_url).broker_info().log_end_offset

    async def send_half():
        async with AsyncTransactionProducer("bad-pg", m.address, None) as p:
            await p.prepare([Message("Tx", b"x", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": value})], "bad-1")

    with pytest.raises(BrokerError) as e:
        asyncio.run(send_half())
    assert e.value.code_name == "MESSAGE_ILLEGAL" and "CHECK_IMMUNITY_TIME_IN_SECONDS" in e.value.remark, e.value
    assert AdminClient(m.admin_url).broker_info().log_end_offset == end_before  # nothing written
    with Producer("g", m.address, request_timeout=5) as p:  # the group still takes SYNC writes
        p.send(Message("Keep", b"after the bad one"))
    master_end = AdminClient(m.admin_url).broker_info().log_end_offset
    assert AdminClient(s.admin_url).broker_info().local_durable_offset == master_end
