"""A write the fault harness saw acknowledged and then lost (chaos/, seeds 7 and 19 of its first
runs), replayed step by step. The master is paused with a producer's send already in its socket;
the operator fails over to one slave; the old master resumes, serves that send, and a producer that
knows only it sends again. Had the other slave still been following the old master, it would have
acknowledged those writes (SYNC replication asks no more), the producer would have heard SUCCESS,
and the new master would never have had them. The operator's plan (`failover.fence_before_promotion`)
turns every answering broker into a follower of the successor before promoting it, so the resumed
master finds no slave to acknowledge at its old epoch: every acknowledged send is on the new master.
With the plan reverted to fencing only a master that answers, this test fails."""

import signal
import threading
from pathlib import Path

from support.waiting import wait_until
from txbroker.client import ClientError, Message, Producer, PullConsumer
from txbroker.client.admin import AdminClient
from txbroker_operator import failover
from txbroker_operator.brokers import BrokerInfo
from txbroker_operator.observe import Member

FLAGS = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-timeout-ms", "1000",
         "--replication-heartbeat-ms", "100")


def _admin(b) -> AdminClient:
    return AdminClient(b.admin_url, timeout=1)


def _queued_bytes(port: int) -> int:
    """Bytes waiting unread in the established sockets of a listener on `port` (the paused master's)."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port and f[3] == "01":
            total += int(f[4].split(":")[1], 16)
    return total


def _member(name: str, index: int, b) -> Member:
    """The broker as the operator observes it: its info, or None when its admin API does not answer."""
    try:
        info = BrokerInfo.from_api(_admin(b).broker_info())
    except Exception:  # noqa: BLE001 - a paused broker does not answer
        info = None
    return Member(name, index, {"metadata": {}, "status": {}}, info)


def test_a_resumed_master_gets_no_write_acknowledged_after_the_operators_failover(broker_factory):
    m = broker_factory(*FLAGS, "--broker-name", "m", name="m")
    s1, s2 = (broker_factory("--role", "slave", "--master", m.address, "--broker-name", n, *FLAGS, name=n)
              for n in ("s1", "s2"))

    def in_sync_with_m() -> int:
        return sum(x["in_sync"] for x in _admin(m).get("/api/v1/broker")["replication"]["slaves"])

    wait_until(lambda: in_sync_with_m() == 2, what="both slaves in sync")
    acknowledged, refused = [], []

    def send(p: Producer, body: bytes) -> None:
        try:
            p.send(Message("Orders", body))
            acknowledged.append(body)
        except ClientError as e:
            refused.append((body, e))

    with Producer("zombie-pg", m.address, request_timeout=20) as p:
        send(p, b"before")
        m.proc.send_signal(signal.SIGSTOP)
        try:
            sender = threading.Thread(target=send, args=(p, b"queued"))
            sender.start()
            wait_until(lambda: _queued_bytes(m.port) > 0, what="the send waiting in the paused master's socket")
            brokers = {"m": _member("m", 0, m), "s1": _member("s1", 1, s1), "s2": _member("s2", 2, s2)}
            assert brokers["m"].info is None and brokers["s2"].info.master == m.address
            for b in failover.fence_before_promotion(brokers, "s1"):
                _admin({"m": m, "s2": s2}[b.name]).post(
                    "/api/v1/role", {"role": "slave", "master": s1.address, "epoch": 2})
            _admin(s1).post("/api/v1/role", {"role": "master", "epoch": 2})
        finally:
            m.proc.send_signal(signal.SIGCONT)
        sender.join(60)
        # Before the operator's next pass finds the old master answering and demotes it: either s2
        # follows the new master, or it is back in sync with the old one (and would acknowledge).
        wait_until(lambda: _admin(s2).get("/api/v1/broker")["master"] == s1.address or in_sync_with_m() > 0,
                   what="s2 following the new master, or back in sync with the old one")
        send(p, b"after the resume")
    assert b"before" in acknowledged and len(acknowledged) + len(refused) == 3, (acknowledged, refused)
    with PullConsumer(s1.address) as c:
        served = {x.body for x in c.read_all("Orders")}
    lost = [b for b in acknowledged if b not in served]
    assert not lost, f"acknowledged by the resumed old master, not on the new one: {lost} (refused: {refused})"
