"""The zombie master (issue 19): the master is paused, a slave is promoted at a higher epoch, and the
old master later resumes still believing it leads. Producers given every address keep committing
through the new master while the old one is paused, and the old one, once resumed, fences itself
on hearing of the higher epoch from a client; no acknowledged commit is lost (SYNC replication)."""

import asyncio
import signal
import threading

import pytest

from support.controller import info, send, subscribed
from support.waiting import wait_until
from support import txload
from support.txload import Ledger, invariant_violations, run_load
from txbroker.client import AsyncTransactionProducer
from txbroker.client.admin import AdminClient, AdminError

FLAGS = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-timeout-ms", "500",
         "--replication-heartbeat-ms", "100", "--check-interval-ms", "300", "--transaction-timeout-ms", "200")


def test_producers_leave_a_paused_deposed_master_and_it_fences_itself_when_it_resumes(broker_factory):
    m = broker_factory(*FLAGS, "--broker-name", "m", name="m")
    s1, s2 = (broker_factory("--role", "slave", "--master", m.address, "--broker-name", n, *FLAGS, name=n)
              for n in ("s1", "s2"))
    wait_until(lambda: sum(x["in_sync"] for x in info(m)["replication"]["slaves"]) == 2, what="both slaves in sync")
    ledger, acked, stop = Ledger(), {}, threading.Event()
    load = threading.Thread(target=run_load, args=([m.address, s1.address, s2.address], ledger, acked, stop),
                            kwargs={"producers": 4})
    load.start()
    try:
        wait_until(lambda: len(acked) >= 100, 30, what="load on the first master")
        m.proc.send_signal(signal.SIGSTOP)
        AdminClient(s1.admin_url).post("/api/v1/role", {"role": "master", "epoch": 2})
        AdminClient(s2.admin_url).post("/api/v1/role", {"role": "slave", "master": s1.address, "epoch": 2})
        before = len(acked)
        wait_until(lambda: len(acked) >= before + 200, 20,
                   what="producers to commit through the new master while the old one is paused")
        m.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: info(m)["fenced_by"] == 2, 20, what="the resumed old master to fence itself")
        before = len(acked)
        wait_until(lambda: len(acked) >= before + 200, 20, what="commits to go on after the old master resumed")
    finally:
        m.proc.send_signal(signal.SIGCONT)
        stop.set()
        load.join(60)

    async def settle():
        async with AsyncTransactionProducer("orders-pg", s1.address, ledger):
            await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(
                lambda: txload.settled(s1.admin_url), 60, what="every transaction decided on the new master"))

    asyncio.run(settle())
    problems = invariant_violations(txload.visible(s1.address, "Orders"), acked, must_keep_acked=True)
    assert not problems, problems[:10]


# Under an operator (or the fault harness's controller) a master that starts again on a store it led
# takes no write until the controller confirms it still is the master: its pod's role may have been
# read before a promotion it missed while it was down.
CONFIRMED = (*FLAGS, "--await-role-confirmation")


def slaves_in_sync(b) -> int:
    return sum(x["in_sync"] for x in info(b)["replication"]["slaves"])


def approve(b, epoch: int, *slaves: str) -> None:
    """The controller's pass: once they subscribe, their acknowledgements count (sync_set.py)."""
    wait_until(lambda: subscribed(b) >= set(slaves), what=f"{', '.join(slaves)} to subscribe")
    AdminClient(b.admin_url).put("/api/v1/replication/sync-set", {"epoch": epoch, "slaves": list(slaves)})


def test_a_master_restarted_with_its_role_from_before_a_promotion_acknowledges_nothing(broker_factory):
    """Found by the fault schedules (tests/faults seed 3): a group lost power; while its master was
    down the controller promoted a slave; the old master started again as master and the third
    broker as its slave (both had their roles read before the promotion), and a send it
    acknowledged, held by that slave, was cut off both when they followed the new master."""
    m = broker_factory(*CONFIRMED, "--broker-name", "m", name="m")
    s1, s2 = (broker_factory("--role", "slave", "--master", m.address, "--broker-name", n, *CONFIRMED, name=n)
              for n in ("s1", "s2"))
    approve(m, 1, "s1", "s2")
    wait_until(lambda: slaves_in_sync(m) == 2, what="both slaves in sync")
    acked = [f"before-{i}" for i in range(5) if send(m.address, f"before-{i}") == "acknowledged"]
    assert len(acked) == 5, "a new master (epoch 1) takes writes without a confirmation"

    m.kill()
    s2.kill()
    AdminClient(s1.admin_url).post("/api/v1/role", {"role": "master", "epoch": 2})  # the controller's failover
    m.restart()   # as master: its role as it was before the promotion
    s2.restart()  # following m
    wait_until(lambda: subscribed(m) == {"s2"}, what="the restarted slave to follow the restarted old master")
    assert "confirm" in info(m)["unconfirmed"], info(m)
    answer = send(m.address, "to-the-old-master")
    assert answer.startswith("refused") and "confirms" in answer, answer

    for b in (m, s2):   # the controller's next pass: both follow the new master
        AdminClient(b.admin_url).post("/api/v1/role", {"role": "slave", "master": s1.address, "epoch": 2})
    approve(s1, 2, "m", "s2")
    wait_until(lambda: slaves_in_sync(s1) == 2, what="both to follow the new master")
    acked += [f"after-{i}" for i in range(5) if send(s1.address, f"after-{i}") == "acknowledged"]
    assert len(acked) == 10
    assert set(txload.visible(s1.address, "T")) == set(acked)


def test_a_restarted_master_takes_writes_once_its_controller_confirms_it(broker_factory):
    m = broker_factory(*CONFIRMED, "--broker-name", "m", name="m")
    broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s1", *CONFIRMED, name="s1")
    approve(m, 1, "s1")
    wait_until(lambda: slaves_in_sync(m) == 1, what="the slave in sync")
    m.restart()
    wait_until(lambda: subscribed(m) == {"s1"}, what="the slave to follow the restarted master")
    assert send(m.address, "unconfirmed").startswith("refused")
    admin = AdminClient(m.admin_url)
    with pytest.raises(AdminError, match="at epoch 1.*got 0"):
        admin.post("/api/v1/role", {"role": "master", "epoch": 0})
    # the controller: still the master at epoch 1, counting the slave its status records
    admin.post("/api/v1/role", {"role": "master", "epoch": 1, "sync_set": ["s1"]})
    assert info(m)["unconfirmed"] == "" and info(m)["replication"]["sync_set"] == ["s1"]
    assert send(m.address, "confirmed") == "acknowledged"
    admin.post("/api/v1/role", {"role": "master", "epoch": 1})   # said again (a controller's retried pass): no change
    assert send(m.address, "confirmed-again") == "acknowledged"
    assert set(txload.visible(m.address, "T")) == {"confirmed", "confirmed-again"}
