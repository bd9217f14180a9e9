"""SYNC replication and SYNC flush under a random schedule of slave faults (issue 23): slaves are
killed (-9) and restarted, or paused (SIGSTOP, a silent link as a partition makes one) and resumed,
at moments drawn from a seed, while transactional producers and a consumer group with retries run;
then the master is killed and the most caught-up slave promoted. Over the whole history: no
acknowledged commit lost or stored twice, and no rolled-back message visible anywhere, retry and
dead-letter topics included."""

import asyncio
import random
import signal
import threading
import time
import zlib
from collections import Counter

import pytest

from support.cli import run_cli
from support.waiting import wait_until
from support import txload
from support.txload import Ledger, invariant_violations, run_load
from txbroker.client import AsyncTransactionProducer, ConsumeStatus, LocalTransactionState as S, PushConsumer
from txbroker.client.admin import AdminClient

FLAGS = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-timeout-ms", "500",
         "--replication-heartbeat-ms", "100", "--check-interval-ms", "300", "--transaction-timeout-ms", "200",
         "--message-delay-level", " ".join(["100ms"] * 18))
GROUP = "faults-cg"
CONSUMER = dict(heartbeat_interval=0.5, rebalance_interval=1.0, offset_commit_interval=0.2, long_poll_ms=300,
                max_reconsume_times=2)


def info(b):
    return AdminClient(b.admin_url).get("/api/v1/broker")


def nemesis(rnd: random.Random, slaves, stop: threading.Event, faults: Counter) -> None:
    """Until `stop`: every 0.1-0.5 s, a random slave is killed and restarted, or paused for up to 1.5 s."""
    while not stop.wait(rnd.uniform(0.1, 0.5)):
        s = rnd.choice(slaves)
        if rnd.random() < 0.4:
            s.kill(signal.SIGKILL)
            faults["kill"] += 1
            stop.wait(rnd.uniform(0.0, 1.0))
            s.start()
        else:
            s.proc.send_signal(signal.SIGSTOP)
            faults["pause"] += 1
            stop.wait(rnd.uniform(0.05, 1.5))
            s.proc.send_signal(signal.SIGCONT)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_sync_replication_keeps_every_acknowledged_commit_under_random_slave_faults(broker_factory, seed):
    m = broker_factory(*FLAGS, "--broker-name", "m", name="m")
    slaves = [broker_factory("--role", "slave", "--master", m.address, "--broker-name", f"s{i}", *FLAGS, name=f"s{i}")
              for i in (1, 2)]
    wait_until(lambda: sum(x["in_sync"] for x in info(m)["replication"]["slaves"]) == 2, what="both slaves in sync")
    addresses = [m.address] + [s.address for s in slaves]
    run_cli("topic", "create", "Orders", "--admin", m.admin_url)
    ledger, acked, stop, faults = Ledger(), {}, threading.Event(), Counter()
    failed_once: set[str] = set()
    delivered = Counter()
    lock = threading.Lock()

    def consume(msgs, ctx):
        with lock:
            for msg in msgs:
                body = msg.body.decode()
                if zlib.crc32(msg.body) % 10 == 0 and body not in failed_once:  # some go through %RETRY%
                    failed_once.add(body)
                    return ConsumeStatus.RECONSUME_LATER
                delivered[body] += 1
        return ConsumeStatus.CONSUME_SUCCESS

    load = threading.Thread(target=run_load, args=(addresses, ledger, acked, stop), kwargs={"producers": 4})
    chaos = threading.Thread(target=nemesis, args=(random.Random(seed * 7919), slaves, stop, faults))
    with PushConsumer(GROUP, addresses, "Orders", consume, **CONSUMER):
        load.start()
        chaos.start()
        time.sleep(6)  # the length of the schedule, not a wait for a condition
        stop.set()
        chaos.join(30)
        load.join(60)
        for s in slaves:
            if s.proc.poll() is not None:
                s.start()
        wait_until(lambda: sum(x["in_sync"] for x in info(m)["replication"]["slaves"]) == 2, 30,
                   what="both slaves back in sync")
        m.kill(signal.SIGKILL)
        new, other = sorted(slaves, key=lambda s: info(s)["local_durable_offset"], reverse=True)
        epoch = info(new)["epoch"] + 1
        AdminClient(new.admin_url).post("/api/v1/role", {"role": "master", "epoch": epoch})
        AdminClient(other.admin_url).post("/api/v1/role", {"role": "slave", "master": new.address, "epoch": epoch})
        async def settle():  # check-back of what the old master left undecided
            async with AsyncTransactionProducer("orders-pg", new.address, ledger):
                await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(
                    lambda: txload.settled(new.admin_url), 60, what="every transaction decided on the new master"))

        asyncio.run(settle())
        seen = txload.visible(new.address, "Orders")
        wait_until(lambda: set(delivered) >= set(seen), 60, what="the consumer group to receive every commit")
    retried = sum((txload.visible(new.address, t) for t in (f"%RETRY%{GROUP}", f"%DLQ%{GROUP}")
                   if t in {x["name"] for x in AdminClient(new.admin_url).get("/api/v1/topics")["topics"]}), Counter())
    commits = sum(1 for st in acked.values() if st is S.COMMIT)
    print(f"\nseed {seed}: faults {dict(faults)}, {len(acked)} acknowledged decisions ({commits} commits), "
          f"{len(seen)} visible, {len(retried)} through retry/DLQ, {sum(delivered.values())} deliveries")
    assert faults, "the schedule injected no fault"
    problems = invariant_violations(seen, acked, must_keep_acked=True)
    problems += [f"rolled-back {b} reached a retry or dead-letter topic" for b in retried
                 if int(b.split("-")[1]) % 4 == 0]
    problems += [f"{b} delivered but never committed" for b in delivered if b not in seen]
    assert not problems, f"seed {seed}: {problems[:10]}"
