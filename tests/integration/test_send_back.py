"""CONSUMER_SEND_MSG_BACK as a consumer group uses it: only a message the group could read comes back
through its retry topic (never a half message, a rolled-back one, or one of another topic), and a
retried send-back stores one copy (issue 23, defects 2 and 6)."""

import asyncio
from collections import Counter

import pytest

from support.waiting import wait_until
from support.listeners import Decided
from txbroker.client import (
    AsyncTransactionProducer, BrokerError, LocalTransactionState as S, Message, Producer, PullConsumer,
)
from txbroker.client.connection import BrokerClient
from txbroker.protocol.bodies import SendBackRequest
from txbroker.protocol.codes import RequestCode

FAST_RETRY = ("--message-delay-level", " ".join(["100ms"] * 18))
GROUP = "sb-cg"


def send_back(b, msg_id: str, topic: str, reconsume: int = 0, max_reconsume: int = 16) -> str:
    """The group's send-back of `msg_id`, which it says it consumed from `topic`: the answer's code."""

    async def go():
        c = BrokerClient(b.address)
        try:
            await c.request(RequestCode.CONSUMER_SEND_MSG_BACK,
                            SendBackRequest(GROUP, msg_id, topic, reconsume, max_reconsume), retry=False)
        finally:
            await c.close()

    try:
        asyncio.run(go())
    except BrokerError as e:
        return e.code_name
    return "SUCCESS"


def bodies(b, topic) -> Counter:
    with PullConsumer(b.address) as c:
        try:
            return Counter(m.body.decode() for m in c.read_all(topic))
        except BrokerError as e:
            if e.code_name == "TOPIC_NOT_EXIST":
                return Counter()
            raise


def barrier(b, name: str, topic: str = "Plain") -> None:
    """A legitimate send-back, waited for in the retry topic: what was refused before it would be there too."""
    with Producer("p", b.address) as p:
        r = p.send(Message(topic, name.encode()))
    assert send_back(b, r.msg_id, topic) == "SUCCESS"
    wait_until(lambda: bodies(b, "%RETRY%" + GROUP)[name] >= 1, what=f"{name} in the retry topic")


def prepared(b, decision: S, body: bytes, topic="Tx") -> str:
    async def go():
        async with AsyncTransactionProducer("sb-pg", b.address, Decided(decision)) as p:
            return await p.send_message_in_transaction(Message(topic, body), None)

    return asyncio.run(go()).msg_ids[0]


@pytest.mark.parametrize("decision", [S.ROLLBACK, S.UNKNOWN])
def test_send_back_of_a_half_message_never_committed_is_refused(broker_factory, decision):
    b = broker_factory(*FAST_RETRY, "--check-interval-ms", "60000")
    msg_id = prepared(b, decision, b"never-committed")
    assert send_back(b, msg_id, "Tx") == "QUERY_NOT_FOUND"
    barrier(b, "barrier")
    assert bodies(b, "%RETRY%" + GROUP) == {"barrier": 1}, "a message never committed reached the retry topic"


def test_send_back_names_the_topic_the_message_is_in(broker_factory):
    b = broker_factory(*FAST_RETRY)
    with Producer("p", b.address) as p:
        secret = p.send(Message("Secret", b"secret-body")).msg_id
    assert send_back(b, secret, "Public") == "QUERY_NOT_FOUND"
    committed = prepared(b, S.COMMIT, b"committed-body")
    assert send_back(b, committed, "Public") == "QUERY_NOT_FOUND"
    assert send_back(b, committed, "Tx") == "SUCCESS"  # a committed transactional message is a message
    barrier(b, "barrier")
    wait_until(lambda: bodies(b, "%RETRY%" + GROUP)["committed-body"] == 1, what="the committed message's retry")
    assert bodies(b, "%RETRY%" + GROUP) == {"barrier": 1, "committed-body": 1}


def test_retried_send_back_stores_one_copy(broker_factory):
    b = broker_factory(*FAST_RETRY)
    with Producer("p", b.address) as p:
        msg_id = p.send(Message("Plain", b"once")).msg_id
        dead_id = p.send(Message("Plain", b"dead-once")).msg_id
    for _ in range(3):  # the answer was lost, say: the consumer sends it back again
        assert send_back(b, msg_id, "Plain", reconsume=2) == "SUCCESS"
        assert send_back(b, dead_id, "Plain", reconsume=3, max_reconsume=3) == "SUCCESS"
    assert send_back(b, msg_id, "Plain", reconsume=3) == "SUCCESS"  # a later failure is another retry
    barrier(b, "barrier")
    wait_until(lambda: bodies(b, "%RETRY%" + GROUP)["once"] >= 2, what="the two retries")
    assert bodies(b, "%RETRY%" + GROUP) == {"barrier": 1, "once": 2}
    assert bodies(b, "%DLQ%" + GROUP) == {"dead-once": 1}
