"""The broker's side of a switchover (issue 32, item 2): a planned move of mastership that fences
the old master only after the new one has everything (POST /api/v1/handover: the master takes no
write, its successor catches up to its exact end, the master becomes its slave; then the successor
is promoted). Real brokers under transactional load: no acknowledged commit lost, none twice, the
old master rejoins without cutting anything off, under ASYNC replication too (where fencing first
may lose what the slave had not yet received). Bad requests are refused changing nothing; a
successor that does not catch up in time leaves the master taking writes again; a master told to
stop serves on until it has handed over."""

from __future__ import annotations

import signal
import threading
from collections import Counter

import pytest

from support import txload
from support.waiting import wait_until
from txbroker.client import Message, Producer
from txbroker.client.admin import AdminClient, AdminError

FLAGS = ("--flush-disk-type", "SYNC", "--replication-heartbeat-ms", "100", "--replication-timeout-ms", "1000",
         "--check-interval-ms", "500", "--transaction-timeout-ms", "300")


def admin(b) -> AdminClient:
    return AdminClient(b.admin_url)


def info(b) -> dict:
    return admin(b).get("/api/v1/broker")


def in_sync(m, *names: str) -> bool:
    return {s["name"] for s in info(m)["replication"]["slaves"] if s["in_sync"]} >= set(names)


def group_of_three(broker_factory, mode: str):
    m = broker_factory("--replication-mode", mode, *FLAGS, "--broker-name", "m", name="m")
    slaves = [broker_factory("--role", "slave", "--master", m.address, "--replication-mode", mode, *FLAGS,
                             "--broker-name", n, name=n) for n in ("s1", "s2")]
    wait_until(lambda: in_sync(m, "s1", "s2"), what="both slaves in sync")
    return m, *slaves


@pytest.mark.parametrize("mode", ["ASYNC", "SYNC"])
def test_a_switchover_under_load_keeps_every_acknowledged_commit(broker_factory, mode):
    m, s1, s2 = group_of_three(broker_factory, mode)
    ledger, acked, failed, stop = txload.Ledger(), {}, [], threading.Event()
    load = threading.Thread(target=txload.run_load, args=([m.address, s1.address, s2.address], ledger, acked, stop),
                            kwargs={"failed": failed})
    load.start()
    try:
        wait_until(lambda: len(acked) >= 60, 30, what="load on the first master")
        before = len(acked)
        done = admin(m).handover("s1", 2)
        # everything the old master wrote is on the successor: handed over at its exact end
        assert done.offset == info(s1)["log_end_offset"] and done.broker.role == "slave"
        assert done.broker.master == s1.address
        admin(s1).change_role("master", 2)
        admin(s2).change_role("slave", 2, s1.address)
        wait_until(lambda: len(acked) >= before + 60, 30, what="load on the new master")
    finally:
        stop.set()
        load.join(60)
    txload.settle(s1.address, s1.admin_url, ledger)
    seen = txload.visible(s1.address)
    problems = txload.invariant_violations(seen, acked, must_keep_acked=True)
    assert not problems, problems[:10]
    # the old master rejoins as a slave without cutting anything off: it never wrote past the hand-over
    wait_until(lambda: info(m)["log_end_offset"] == info(s1)["log_end_offset"] and in_sync(s1, "m", "s2"),
               30, what="the old master caught up as a slave")
    assert "truncat" not in m.log().split("handed over to s1")[-1]
    print(f"switchover under {mode} load: {len(acked)} acknowledged, {len(failed)} client-visible failures"
          + (f" (first: {failed[0]})" if failed else ""))


def test_a_successor_that_does_not_catch_up_in_time_leaves_the_master_taking_writes(broker_factory):
    m = broker_factory("--replication-mode", "ASYNC", *FLAGS, "--broker-name", "m", name="m")
    s = broker_factory("--role", "slave", "--master", m.address, *FLAGS, "--broker-name", "s", name="s")
    wait_until(lambda: in_sync(m, "s"), what="the slave in sync")
    s.proc.send_signal(signal.SIGSTOP)
    try:
        with Producer("p", m.address) as p:
            p.send(Message("Orders", b"before"))   # ASYNC: acknowledged; the paused slave lacks it
            end = info(m)["log_end_offset"]
            with pytest.raises(AdminError) as e:
                admin(m).handover("s", 2, timeout_ms=300)
            assert e.value.status == 503 and e.value.code == "SERVICE_NOT_AVAILABLE"
            assert f"handover to s ({s.address}) at epoch 2 abandoned: s acknowledged up to LSN" in str(e.value)
            assert f"of {end} within 0.3s; this broker takes writes again" in str(e.value)
            now = info(m)
            assert (now["role"], now["epoch"], now["handover"]) == ("master", 1, "")
            p.send(Message("Orders", b"after"))
    finally:
        s.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: txload.visible(m.address) == Counter({"before": 1, "after": 1}), what="both messages")


def test_bad_handover_requests_are_refused_and_change_nothing(broker_factory):
    m = broker_factory("--replication-mode", "ASYNC", *FLAGS, "--broker-name", "m", name="m")
    s = broker_factory("--role", "slave", "--master", m.address, *FLAGS, "--broker-name", "s", name="s")
    wait_until(lambda: in_sync(m, "s"), what="the slave in sync")
    cases = [
        (lambda: admin(m).handover("nobody", 2), 409, f"nobody is not a slave replicating from this master "
                                                      f"(its slaves: s ({s.address}))"),
        (lambda: admin(m).handover("s", 1), 409, "the successor's epoch must be above this master's 1, got 1"),
        (lambda: admin(s).handover("m", 2), 409, "only a master taking writes hands over; this broker is a slave"),
        (lambda: admin(m).post("/api/v1/handover", {"successor": "s"}), 400, 'body must be {"successor"'),
        (lambda: admin(m).handover("s", 2, timeout_ms=0), 400, "timeout_ms must be between 1 and 120000, got 0"),
    ]
    for call, status, says in cases:
        with pytest.raises(AdminError) as e:
            call()
        assert e.value.status == status and says in str(e.value), str(e.value)
    assert (info(m)["role"], info(m)["epoch"], info(s)["role"]) == ("master", 1, "slave")
    with Producer("p", m.address) as p:
        p.send(Message("Orders", b"still-master"))


def test_a_handover_to_a_slave_not_in_sync_is_refused_at_once(broker_factory):
    """Not an abandoned handover after its timeout, with writes stalled meanwhile: a slave catching
    up from disk is refused up front, naming how far it is and which slaves are in sync."""
    # heartbeats far apart: the paused slave stays connected (a silent one would be dropped)
    m = broker_factory("--replication-mode", "ASYNC", *FLAGS, "--replication-heartbeat-ms", "20000",
                       "--broker-name", "m", name="m")
    s = broker_factory("--role", "slave", "--master", m.address, *FLAGS, "--broker-name", "s", name="s")
    t = broker_factory("--role", "slave", "--master", m.address, *FLAGS, "--broker-name", "t", name="t")
    wait_until(lambda: in_sync(m, "s", "t"), what="both slaves in sync")
    s.proc.send_signal(signal.SIGSTOP)
    try:
        with Producer("p", m.address) as p:
            def s_behind():   # what s cannot take while paused fills its socket: fed from disk later
                p.send(Message("Big", b"x" * 256 * 1024))
                return [x for x in info(m)["replication"]["slaves"] if x["name"] == "s" and not x["in_sync"]]
            wait_until(s_behind, 60, what="s out of sync")
            # t, not paused, can trail the burst of big writes for a moment: the refusal names it
            # only once it has caught up (no writes follow, so it stays in sync)
            wait_until(lambda: in_sync(m, "t"), what="t in sync again")
            with pytest.raises(AdminError) as e:
                admin(m).handover("s", 2)
            assert e.value.status == 409, str(e.value)
            assert f"s ({s.address}) is not in sync with this master: it has acknowledged up to LSN" in str(e.value)
            assert f"hand over to a slave in sync (now: t ({t.address}))" in str(e.value)
            assert (info(m)["role"], info(m)["handover"]) == ("master", "")
            p.send(Message("Orders", b"still-master"))
    finally:
        s.proc.send_signal(signal.SIGCONT)


def test_a_master_told_to_stop_serves_until_it_has_handed_over(broker_factory):
    m = broker_factory("--replication-mode", "SYNC", *FLAGS, "--stop-handover-wait-ms", "60000",
                       "--broker-name", "m", name="m")
    s = broker_factory("--role", "slave", "--master", m.address, "--replication-mode", "SYNC", *FLAGS,
                       "--broker-name", "s", name="s")
    wait_until(lambda: in_sync(m, "s"), what="the slave in sync")
    m.proc.send_signal(signal.SIGTERM)   # a pod being deleted: the kubelet's SIGTERM
    wait_until(lambda: "serving on for up to 60s while mastership is handed over" in m.log(), what="the wait")
    with Producer("p", m.address) as p:
        p.send(Message("Orders", b"while-stopping"))   # still the master, writable
    admin(m).handover("s", 2)
    admin(s).change_role("master", 2)
    assert m.proc.wait(30) == 0
    assert "handed over: stopping" in m.log()
    assert txload.visible(s.address) == Counter({"while-stopping": 1})
