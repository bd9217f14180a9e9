"""The replication link itself (issue 23, suspected defects): a link that goes silent without closing
(a paused or partitioned peer) is noticed by both sides, and one slave counts once toward SYNC
replication however many connections it has opened."""

import asyncio
import signal

import pytest

from support.waiting import wait_until
from txbroker.client import BrokerError, Message, Producer
from txbroker.client.admin import AdminClient
from txbroker.client.connection import Connection
from txbroker.protocol.bodies import ReplicaAck, ReplicaSubscribe, encode
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.store.records import STORE_FORMAT_VERSION

LINK = ("--replication-heartbeat-ms", "200")


def info(b):
    return AdminClient(b.admin_url).get("/api/v1/broker")


def test_slave_notices_a_master_that_went_silent_and_reconnects_when_it_is_back(broker_factory):
    m = broker_factory(*LINK, name="master")
    s = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s", *LINK, name="slave")
    wait_until(lambda: info(s)["replication"]["connected"], what="the slave connected")
    m.proc.send_signal(signal.SIGSTOP)  # the connection stays open: no FIN, no RST, nothing
    try:
        wait_until(lambda: not info(s)["replication"]["connected"], what="the slave to give up on the silent master")
        assert "silent" in info(s)["replication"]["last_error"]
    finally:
        m.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: info(s)["replication"]["connected"], what="the slave to reconnect")


def test_master_drops_a_slave_that_went_silent(broker_factory):
    m = broker_factory(*LINK, "--replication-mode", "SYNC", name="master")
    s = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s", *LINK, name="slave")
    wait_until(lambda: [x["name"] for x in info(m)["replication"]["slaves"]] == ["s"], what="the slave subscribed")
    s.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: info(m)["replication"]["slaves"] == [], what="the master to drop the silent slave")
        with Producer("g", m.address) as p, pytest.raises(BrokerError) as e:
            p.send(Message("Link", b"x"))
        assert e.value.code_name == "SLAVE_NOT_AVAILABLE"  # at once, not after a timeout per write
    finally:
        s.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: [x["name"] for x in info(m)["replication"]["slaves"]] == ["s"], what="the slave back")


def test_a_slave_counts_once_however_many_connections_it_opened(broker_factory):
    """A slave whose old connection the master has not seen close yet (a partition) subscribes again:
    it must not count as two slaves toward --sync-replicas 2."""
    m = broker_factory("--replication-mode", "SYNC", "--sync-replicas", "2", *LINK, name="master")
    broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s", *LINK, name="slave")
    wait_until(lambda: [x["in_sync"] for x in info(m)["replication"]["slaves"]] == [True], what="s in sync")

    async def second_link_of_s():
        c = Connection(m.address)
        await c.open(3.0)
        end = info(m)["log_end_offset"]
        frame = await c.call(RequestCode.REPLICATION_SUBSCRIBE, encode(ReplicaSubscribe("s", end + 1, 1, "", reads=[STORE_FORMAT_VERSION])), 5.0)
        assert frame.code == ResponseCode.SUCCESS
        c.send_oneway(RequestCode.REPLICATION_ACK, encode(ReplicaAck(end, 1)))
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: wait_until(lambda: len(info(m)["replication"]["slaves"]) >= 1, what="the link"))
        slaves = info(m)["replication"]["slaves"]
        c.close()
        return slaves

    slaves = asyncio.run(second_link_of_s())
    assert [x["name"] for x in slaves] == ["s"], f"one slave listed as {len(slaves)}"
    with Producer("g", m.address) as p, pytest.raises(BrokerError) as e:
        p.send(Message("Link", b"needs-two-slaves"))
    assert e.value.code_name == "SLAVE_NOT_AVAILABLE"
