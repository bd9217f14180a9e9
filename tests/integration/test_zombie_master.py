"""The zombie master (issue 19): the master is paused, a slave is promoted at a higher epoch, and the
old master later resumes still believing it leads. Producers given every address keep committing
through the new master while the old one is paused, and the old one, once resumed, fences itself
on hearing of the higher epoch from a client; no acknowledged commit is lost (SYNC replication)."""

import asyncio
import signal
import threading

from support.waiting import wait_until
from support import txload
from support.txload import Ledger, invariant_violations, run_load
from txbroker.client import AsyncTransactionProducer
from txbroker.client.admin import AdminClient

FLAGS = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-timeout-ms", "500",
         "--replication-heartbeat-ms", "100", "--check-interval-ms", "300", "--transaction-timeout-ms", "200")


def info(b):
    return AdminClient(b.admin_url).get("/api/v1/broker")


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
