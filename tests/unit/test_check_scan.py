"""The check-back scan's rules, on a real in-process broker with the clock injected
(`CheckService.scan(now=)`): immunity and the timeout hold a check back without burning one, the
interval spaces checks, `check_max` parks, a check counts with no producer to ask (I4), one live
producer is asked with a one-way CHECK_TRANSACTION_STATE, and a job's members are never checked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
from harness import InProcessBroker  # noqa: E402

from txbroker.protocol import bodies  # noqa: E402
from txbroker.protocol.codes import RequestCode  # noqa: E402
from txbroker.protocol.framing import FrameDecoder, encode_frame  # noqa: E402
from txbroker.protocol.names import PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS  # noqa: E402
from txbroker.store.records import PARKED, PREPARED  # noqa: E402

TIMEOUT_MS, INTERVAL_MS, CHECK_MAX = 2_000, 5_000, 3
# the broker's own scans wait an hour: only the test's scans run
SETTINGS = {"transaction": {"timeout_ms": TIMEOUT_MS, "check_interval_ms": 3_600_000, "check_max": CHECK_MAX}}


@pytest.fixture
def broker():
    b = InProcessBroker(auth=False, config=SETTINGS)
    # the interval under test is a group's own setting, as the operator applies it
    async def apply():
        await b.broker.settings.update_group("scan-pg", {"check_interval_ms": INTERVAL_MS}, 1)[1]
    b.run(apply())
    yield b
    b.close()


def request(b: InProcessBroker, code: RequestCode, body, conn=None):
    """Send one request over `conn` (a new connection if None); returns the connection's transport."""
    async def go():
        c, t = (conn, None) if conn is not None else b.connect()
        c.data_received(encode_frame(0, code, 1, bodies.encode(body)))
        await b.settle(c)
        return t
    return b.run(go())


def half(b: InProcessBroker, txid: str, properties: dict | None = None, conn=None, job_id: str = ""):
    """A half message of group scan-pg; its pending record."""
    msg = bodies.Message("ScanT", b"x", properties=properties or {})
    request(b, RequestCode.SEND_MESSAGE, bodies.SendRequest("scan-pg", [msg], txid, job_id), conn)
    return b.broker.state.pending_transaction(txid)


async def _connected(b: InProcessBroker):
    return b.connect()


def scan(b: InProcessBroker, now: int):
    async def go():
        result = b.broker.check_service.scan(now=now)
        await b.broker.state.drain()  # the scan's CheckRecord and ParkRecords, applied
        return result
    return b.run(go())


def test_the_timeout_holds_a_check_back_and_waiting_burns_none(broker):
    p = half(broker, "t-timeout")
    scan(broker, p.born_ms + TIMEOUT_MS - 1)
    assert broker.broker.state.pending_transaction("t-timeout").checks == 0
    scan(broker, p.born_ms + TIMEOUT_MS)
    assert broker.broker.state.pending_transaction("t-timeout").checks == 1


def test_a_messages_own_immunity_holds_it_longer_than_the_timeout(broker):
    p = half(broker, "t-immune", {PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: "30"})
    scan(broker, p.born_ms + TIMEOUT_MS)
    scan(broker, p.born_ms + 29_999)
    assert broker.broker.state.pending_transaction("t-immune").checks == 0
    scan(broker, p.born_ms + 30_000)
    assert broker.broker.state.pending_transaction("t-immune").checks == 1


def test_the_interval_spaces_checks_and_check_max_parks(broker):
    p = half(broker, "t-max")
    t = p.born_ms + TIMEOUT_MS
    for n in range(1, CHECK_MAX + 1):
        scan(broker, t)
        assert broker.broker.state.pending_transaction("t-max").checks == n
        scan(broker, t + INTERVAL_MS - 1)  # too soon: no check
        assert broker.broker.state.pending_transaction("t-max").checks == n
        t += INTERVAL_MS
    result = scan(broker, t)
    assert result.parked == 1
    assert broker.broker.state.pending_transaction("t-max").state == PARKED and broker.broker.state.pending_transaction("t-max").checks == CHECK_MAX
    assert scan(broker, t + 10 * INTERVAL_MS).parked == 0  # parked stays parked: no more checks


def test_a_check_counts_with_no_producer_to_ask_and_a_live_one_is_asked_one_way(broker):
    p = half(broker, "t-nobody")
    result = scan(broker, p.born_ms + TIMEOUT_MS)
    assert result.without_producer >= 1 and broker.broker.state.pending_transaction("t-nobody").checks == 1

    producer, transport = broker.run(_connected(broker))
    request(broker, RequestCode.HEARTBEAT, bodies.HeartbeatRequest("scan-client", ["scan-pg"]), producer)
    transport.out.clear()
    q = half(broker, "t-asked", conn=producer)
    scan(broker, q.born_ms + TIMEOUT_MS)
    checks = [f for f in FrameDecoder(1 << 20).feed(bytes(transport.out))
              if f.code == RequestCode.CHECK_TRANSACTION_STATE]
    asked = [bodies.decode(bodies.CheckTransactionStateRequest, f.body) for f in checks]
    assert [a.transaction_id for a in asked if a.transaction_id == "t-asked"] == ["t-asked"]
    assert all(f.is_oneway for f in checks)


def test_a_jobs_member_is_never_checked_back(broker):
    transport = request(broker, RequestCode.OPEN_JOB, bodies.OpenJobRequest("scan-pg", 600_000, "scan-job"))
    (opened,) = FrameDecoder(1 << 20).feed(bytes(transport.out))
    member = half(broker, "t-member", job_id=bodies.decode(bodies.JobInfo, opened.body).job_id)
    plain = half(broker, "t-plain")
    assert member.job_id
    for t in (plain.born_ms + TIMEOUT_MS, plain.born_ms + TIMEOUT_MS + INTERVAL_MS):
        scan(broker, t)
    assert broker.broker.state.pending_transaction("t-member").checks == 0
    assert broker.broker.state.pending_transaction("t-member").state == PREPARED
    assert broker.broker.state.pending_transaction("t-plain").checks == 2


def test_a_clock_set_back_delays_a_check_by_the_timeout_not_by_the_skew(broker):
    """The fault harness, seeds 422 and 456: a master's clock 120 s ahead stamped half messages and
    checks; once set right, nothing was checked for 120 s. Now a stamp ahead of the clock counts
    from when a scan first sees it: the timeout (immunity) is still waited out in full."""
    p = half(broker, "t-ahead")
    back = p.born_ms - 120_000  # the clock, set back
    scan(broker, back)
    scan(broker, back + TIMEOUT_MS - 1)
    assert broker.broker.state.pending_transaction("t-ahead").checks == 0
    scan(broker, back + TIMEOUT_MS)
    assert broker.broker.state.pending_transaction("t-ahead").checks == 1
    # the check was stamped by the set-back clock: the interval runs from it
    scan(broker, back + TIMEOUT_MS + INTERVAL_MS - 1)
    assert broker.broker.state.pending_transaction("t-ahead").checks == 1
    scan(broker, back + TIMEOUT_MS + INTERVAL_MS)
    assert broker.broker.state.pending_transaction("t-ahead").checks == 2


def test_a_delayed_delivery_stamped_by_a_clock_since_set_back_is_due_now(broker):
    """The fault harness, seed 481: retries scheduled while the master's clock ran 120 s ahead were
    due two minutes late once it was set right, and every later retry of their level waited behind
    them (a level's queue is delivered in order)."""
    from txbroker.protocol.names import PROPERTY_DELAY, PROPERTY_DELIVER_MS, PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC
    from txbroker.broker.transaction.service import now_ms
    b = broker.broker
    level_ms = b.schedule.levels_ms[0]

    def delayed(body: bytes, deliver_ms: int):
        props = {PROPERTY_REAL_TOPIC: "ScanRetry", PROPERTY_DELAY: "1", PROPERTY_DELIVER_MS: str(deliver_ms)}
        return bodies.Message(SCHEDULE_TOPIC, body, properties=props, queue_id=0)

    async def go():
        await b.schedule.stop()  # only the test's delivery runs
        now = now_ms()
        _, _, durable = b.state.append_messages(now, [delayed(b"ahead", now + level_ms + 120_000),
                                                      delayed(b"later", now + level_ms // 2 + 60_000),
                                                      delayed(b"on-time", now + level_ms)])
        await durable
        return b.schedule.deliver_due()
    assert broker.run(go()) == 2  # the two stamped too far ahead; the on-time one waits its delay


def test_a_participant_stamped_by_a_clock_since_set_back_asks_its_home_after_the_timeout(tmp_path):
    """The grown fault harness, seed 10: a participant stored while its master's clock ran 120 s
    ahead did not ask its home for 120 s after the clock was set right (its age counted from the
    stamp), so a transaction committed at home stayed half visible past settling. As check-back
    does, a stamp ahead of the clock counts from when a sweep first sees it."""
    route = tmp_path / "route.yaml"
    route.write_text("cluster: c\nversion: 1\ngroups:\n"
                     "  - {name: g-here, addresses: ['127.0.0.1:1'], state: active}\n"
                     "  - {name: g-home, addresses: ['127.0.0.1:2'], state: active}\n")
    broker = InProcessBroker(auth=False, config={**SETTINGS, "group": "g-here", "cluster_file": str(route)})
    try:
        _participant_asks_after_the_timeout(broker)
    finally:
        broker.close()


def _participant_asks_after_the_timeout(broker):
    request(broker, RequestCode.SEND_MESSAGE,
            bodies.SendRequest("scan-pg", [bodies.Message("ScanT", b"x")], "t-part", home="g-home"))
    p = broker.broker.state.pending_transaction("t-part")
    asked = []

    async def ask(home, group, txids):
        asked.append((home, group, list(txids)))
        return None  # the home cannot be asked here; what matters is that it is asked

    broker.broker.participants.ask = ask
    back = p.born_ms - 120_000  # the clock, set back

    def sweep(now):
        return broker.run(broker.broker.participants.sweep(now))

    sweep(back)
    sweep(back + TIMEOUT_MS - 1)
    assert asked == []  # the timeout still runs in full
    sweep(back + TIMEOUT_MS)
    assert asked == [("g-home", "scan-pg", ["t-part"])], asked
