"""The client library as an application sees it when the broker goes away: it waits for a broker
that comes back, and it gives up on one that stops answering with an error that says where."""

import signal
import threading

import pytest

from support.listeners import Decided
from txbroker.client import LocalTransactionState as S, Message, PullConsumer, TransactionProducer
from txbroker.client.errors import ClientError, RequestTimeout


def test_a_transaction_sent_while_the_broker_restarts_completes_once_it_is_back(broker):
    with TransactionProducer("pg-restart", broker.address, Decided(S.COMMIT), request_timeout=30) as p:
        p.send_message_in_transaction(Message("TopicRestart", b"before"), None)
        assert broker.stop() == 0
        outcome = {}

        def send():
            try:
                outcome["result"] = p.send_message_in_transaction(Message("TopicRestart", b"during"), None)
            except ClientError as e:
                outcome["error"] = e

        sender = threading.Thread(target=send)
        sender.start()
        broker.start()  # same data directory and ports
        sender.join(60)
        assert not sender.is_alive() and "error" not in outcome, outcome
        r = outcome["result"]
        assert r.send_status == "SEND_OK" and r.local_state is S.COMMIT and not r.end_error
    with PullConsumer(broker.address) as c:
        assert sorted(m.body for m in c.read_all("TopicRestart")) == [b"before", b"during"]


def test_a_frozen_broker_times_out_with_an_error_naming_the_request_and_the_broker(broker):
    with TransactionProducer("pg-frozen", broker.address, Decided(S.COMMIT), request_timeout=1) as p:
        p.send_message_in_transaction(Message("TopicFrozen", b"warm"), None)
        broker.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(RequestTimeout) as e:
                p.send_message_in_transaction(Message("TopicFrozen", b"late"), None)
        finally:
            broker.proc.send_signal(signal.SIGCONT)
    assert "SEND_MESSAGE" in str(e.value) and broker.address in str(e.value)
    with TransactionProducer("pg-frozen", broker.address, Decided(S.COMMIT)) as p:  # the thawed broker serves again
        assert p.send_message_in_transaction(Message("TopicFrozen", b"after"), None).send_status == "SEND_OK"
    with PullConsumer(broker.address) as c:
        bodies = [m.body for m in c.read_all("TopicFrozen")]
    assert b"warm" in bodies and b"after" in bodies


def test_a_client_polls_for_a_lone_answer_and_sleeps_while_many_are_in_flight(broker, monkeypatch):
    """A client's loop polls after a read or write (TXBROKER_IDLE_POLL_US, 200 us by default) only
    while no more than CLIENT_MAX_WAITING of its requests await answers: one request at a time polls;
    the count of requests waiting goes back to 0 when they are answered, however many were in flight.
    (A core counts as free here: on a host whose cores are all taken, as under the parallel test run,
    a client rightly does not poll, and the host's load must not decide this test.)"""
    import asyncio

    from txbroker.client import AsyncProducer
    from txbroker.protocol import idle_poll

    monkeypatch.setattr(idle_poll, "_core_free", lambda: True)

    async def main():
        async with AsyncProducer("pg-poll", broker.address) as p:
            poll = idle_poll.for_loop(asyncio.get_running_loop(), 0)  # the poller the client's connection took
            assert isinstance(poll, idle_poll.ClientPoll)
            for i in range(20):
                await p.send(Message("TopicPoll", b"%d" % i))
            assert poll.polled_seconds > 0 and poll.waiting == 0
            results = await asyncio.gather(*(p.send(Message("TopicPoll", b"burst")) for _ in range(64)))
            assert len(results) == 64 and poll.waiting == 0
    asyncio.run(main())
