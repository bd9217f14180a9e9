"""The sync set (operator/txbroker_operator/sync_set.py): under a controller a SYNC master counts only
the slaves the controller recorded first, so a failover knows every slave that may hold an
acknowledged write. Before it, the controller learnt who was in sync by looking now and then: a
slave that joined and acknowledged between two looks while the known one was down, its master lost
before the next look, left the controller promoting the known one, which lacked those writes.
Here the looks are the test's own steps (the controller's pass), with real brokers."""

import signal

import pytest

from support.cli import run_cli
from support.controller import Controller, info, send, subscribed
from support.waiting import wait_until
from support import txload
from txbroker.client.admin import AdminClient, AdminError
from txbroker_operator import failover
from txbroker_operator.failover import Blocked

FLAGS = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-timeout-ms", "500",
         "--replication-heartbeat-ms", "100", "--await-role-confirmation")
SPEC = {"replication": "SYNC", "flush": "SYNC", "storage": {"size": "1Gi"}, "replicas": 3,
        "failover": {"gracePeriodSeconds": 0}}


def test_a_slave_counts_for_a_sync_write_once_its_controller_recorded_it(broker_factory):
    m = broker_factory(*FLAGS, "--broker-name", "m", name="m")
    s1 = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s1", *FLAGS, name="s1")
    wait_until(lambda: subscribed(m) == {"s1"}, what="s1 to subscribe")
    rep = info(m)["replication"]
    assert rep["sync_set"] == [] and rep["recorded_slaves"] == ["s1"], rep
    answer = send(m.address, "unrecorded")
    assert answer.startswith("refused") and "needs 1 slave(s) in sync, 0" in answer, answer

    ctl = Controller({"m": m, "s1": s1})
    ctl.keep_sync_set()
    assert ctl.status["syncSet"] == {"epoch": 1, "slaves": ["s1"]}
    assert info(m)["replication"]["sync_set"] == ["s1"]
    assert "sync set (approved by the controller): s1" in run_cli("replication", "show", "--admin", m.admin_url).stdout
    assert send(m.address, "recorded") == "acknowledged"
    # a controller that missed a promotion is refused; a body that is not a list of names too
    admin = AdminClient(m.admin_url)
    with pytest.raises(AdminError, match="at epoch 1, not 2"):
        admin.put("/api/v1/replication/sync-set", {"epoch": 2, "slaves": ["s1"]})
    with pytest.raises(AdminError, match="slaves"):
        admin.put("/api/v1/replication/sync-set", {"epoch": 1, "slaves": "s1"})
    with pytest.raises(AdminError, match="sync_set must be a list of slave names, got 's1'"):
        admin.post("/api/v1/role", {"role": "master", "epoch": 1, "sync_set": "s1"})
    with pytest.raises(AdminError, match="not run under a controller"):
        plain = broker_factory("--replication-mode", "SYNC", "--broker-name", "p", name="p")
        AdminClient(plain.admin_url).put("/api/v1/replication/sync-set", {"epoch": 1, "slaves": []})
    # (a refused SYNC write is stored, not promised: it becomes readable once an approved slave has it)
    assert set(txload.visible(m.address, "T")) >= {"recorded"}


def test_a_slave_that_joined_between_two_looks_is_waited_for_by_the_failover(broker_factory):
    """s1 in sync and recorded; s1 dies and s2 joins; the master dies before the controller looks
    again; s1 comes back behind and s2 does not answer. Counting s2 unrecorded, the master would
    have acknowledged writes only s2 held, and the failover would have promoted s1 without them."""
    m = broker_factory(*FLAGS, "--broker-name", "m", name="m")
    s1 = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s1", *FLAGS, name="s1")
    ctl = Controller({"m": m, "s1": s1})
    wait_until(lambda: subscribed(m) == {"s1"}, what="s1 to subscribe")
    ctl.keep_sync_set()
    assert send(m.address, "both-hold-it") == "acknowledged"
    ctl.look()   # the last look while the master is whole: s1 in sync (promotable)
    assert [b.get("promotable") for b in ctl.status["brokers"] if b["name"] == "s1"] == [True]

    s1.kill()
    s2 = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s2", *FLAGS, name="s2")
    ctl.brokers["s2"] = s2
    wait_until(lambda: "s2" in subscribed(m) and info(m)["replication"]["slaves"][0]["lag"] == 0,
               what="s2 to catch up")
    answer = send(m.address, "only-s2-would-hold-it")
    assert answer.startswith("refused"), "acknowledged with the one slave the controller does not know"

    ctl.keep_sync_set()   # the controller's next pass records s2: from then on it counts
    assert ctl.status["syncSet"] == {"epoch": 1, "slaves": ["s1", "s2"]}
    assert send(m.address, "s2-holds-it") == "acknowledged"

    m.kill()
    s2.proc.send_signal(signal.SIGSTOP)
    try:
        s1.restart()
        members = ctl.look()
        decision = failover.decide_failover(SPEC, ctl.status, members, "m", 30)
        assert isinstance(decision, Blocked) and decision.reason == "InSyncSlaveDown", decision
        assert "s2" in decision.message
    finally:
        s2.proc.send_signal(signal.SIGCONT)
    members = ctl.look()
    decision = failover.decide_failover(SPEC, ctl.status, members, "m", 30)
    assert decision.successor == "s2", decision
