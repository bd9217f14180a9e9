"""The fault harness, seed 738 (at ba6276e): the added group g2, two brokers. Its slave b7 had its
write-ahead log cut short while stopped (a torn copy, a failing disk), and came back without records
it had acknowledged; RocksDB recovers a cut log as a crash's tail, so nothing looked damaged. Its
master b6 was killed before b7 had fetched them again, and the controller promoted b7, the slave it
had last seen in sync: 43 acknowledged commits lost, their offsets written again with other
records. A slave whose log now ends before where the controller last saw it, at the same epoch,
lost records it held: it is not taken for one holding every acknowledged write until it is in
sync again. Real brokers; the controller's looks are the test's steps (support/controller.py)."""

import signal

from support.controller import Controller
from support.waiting import wait_until
from txbroker.client import Message, Producer
from txbroker.client.admin import AdminClient
from txbroker_operator import failover
from txbroker_operator.failover import Blocked

FLAGS = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-timeout-ms", "500",
         "--replication-heartbeat-ms", "100", "--await-role-confirmation")
PAIR = {"replication": "SYNC", "flush": "SYNC", "storage": {"size": "1Gi"}, "replicas": 2,
        "failover": {"gracePeriodSeconds": 0}}


def test_a_slave_whose_log_was_cut_short_is_not_promoted_without_what_it_lost(broker_factory, tmp_path):
    m = broker_factory(*FLAGS, "--broker-name", "m", name="m")
    s1 = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s1", *FLAGS, name="s1")
    ctl = Controller({"m": m, "s1": s1})
    wait_until(lambda: any(x["name"] == "s1" for x in AdminClient(m.admin_url).get("/api/v1/broker")["replication"]["slaves"]),
               what="s1 to subscribe")
    ctl.keep_sync_set()
    with Producer("pg", m.address, request_timeout=5) as p:
        for i in range(200):
            p.send(Message("T", f"acknowledged-{i}".encode()))
    ctl.look()   # s1 in sync, at the master's end
    seen = {b["name"]: b for b in ctl.status["brokers"]}
    assert seen["s1"]["promotable"] and seen["s1"]["offset"] == seen["m"]["offset"], seen

    s1.kill()
    wal = max((f for f in (tmp_path / "s1-data").rglob("*.log")), key=lambda f: f.stat().st_size)
    with open(wal, "r+b") as f:   # cut short, as the harness's corruption does
        f.truncate(wal.stat().st_size // 2)
    m.kill()
    s1.restart()
    members = ctl.look()
    assert members["s1"].info.log_end_offset < seen["s1"]["offset"], "the cut took no record: nothing to test"
    decision = failover.decide_failover(PAIR, ctl.status, members, "m", 30)
    assert isinstance(decision, Blocked), decision
    assert "s1" in decision.message, decision

    m.restart()   # the master comes back holding everything: s1 catches up from it, in sync again
    m.proc.send_signal(signal.SIGCONT)
    AdminClient(m.admin_url).post("/api/v1/role", {"role": "master", "epoch": 1, "sync_set": ["s1"]})
    wait_until(lambda: [x["in_sync"] for x in AdminClient(m.admin_url).get("/api/v1/broker")["replication"]["slaves"]]
               == [True], what="s1 in sync again")
    ctl.look()
    assert {b["name"]: b for b in ctl.status["brokers"]}["s1"]["promotable"]
