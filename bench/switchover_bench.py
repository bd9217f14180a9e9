"""A planned switchover beside a failover, under transactional load (issue 32, item 3/5): what the
clients see (operations that failed, acknowledged commits lost) and how long writes stall.

    .venv/bin/python bench/switchover_bench.py [--seconds 5] [--modes ASYNC,SYNC] [--quick]

Local brokers: a master and two slaves, SYNC flush, ASYNC or SYNC replication; one producer with 8
transactions in flight against all three addresses (the client moves to whichever is master). At
`--seconds`, either

- **switchover**: `POST /api/v1/handover` on the master (successor slave1, epoch + 1), then slave1
  promoted and slave2 pointed at it: what the operator does for a rolling update, a drain's
  eviction or the txbroker.dev/switchover annotation;
- **failover**: `kill -9` of the master, then the most caught-up slave promoted and the other
  pointed at it: what the operator does once it has decided (its detection, 10 s of grace by
  default, is not in these figures; on Kubernetes it comes on top).

Write stall: the longest gap between two consecutive acknowledged commits from 1 s before the event
to the end. Failed operations: transactions that raised or whose END_TRANSACTION was not
acknowledged. Lost: acknowledged commits not visible on the new master at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from cluster import Broker, machine, workdir, write_results
from txbroker.client import (
    AsyncTransactionProducer, ClientError, LocalTransactionState as S, Message, PullConsumer, TransactionListener,
)

TOPIC = "Switch"


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return S.COMMIT

    def check_local_transaction(self, msg):
        return S.COMMIT


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}")


def in_sync(m: Broker) -> int:
    return sum(x.in_sync for x in m.admin.broker_info().replication.slaves)


def one_run(kind: str, mode: str, seconds_before: float, seconds_after: float) -> dict:
    with workdir() as (d, brokers):
        args = ["--flush-disk-type", "SYNC", "--replication-mode", mode, "--replication-heartbeat-ms", "100"]
        m = Broker(d, "master", *args).start()
        s1 = Broker(d, "slave1", "--role", "slave", "--master", m.address, *args).start()
        s2 = Broker(d, "slave2", "--role", "slave", "--master", m.address, *args).start()
        brokers += [m, s1, s2]
        wait_for(lambda: in_sync(m) == 2, 30, "both slaves in sync")
        acks: list[float] = []
        acked: set[str] = set()
        failed: list[str] = []

        async def load(stop: asyncio.Event):
            p = await AsyncTransactionProducer("bench-pg", [m.address, s1.address, s2.address], Commit(),
                                               request_timeout=15).start()
            counter = iter(range(10**9))

            async def worker():
                while not stop.is_set():
                    body = f"tx-{next(counter)}"
                    try:
                        r = await p.send_message_in_transaction(Message(TOPIC, body.encode()), None)
                    except ClientError as e:
                        failed.append(f"{body}: {e}")
                        continue
                    if r.end_error or r.send_status != "SEND_OK":
                        failed.append(f"{body}: {r.end_error or r.send_status}")
                    elif r.local_state is S.COMMIT:
                        acks.append(time.monotonic())
                        acked.add(body)

            await asyncio.gather(*(worker() for _ in range(8)))
            await p.close()

        async def run():
            stop = asyncio.Event()
            task = asyncio.ensure_future(load(stop))
            await asyncio.sleep(seconds_before)
            loop = asyncio.get_running_loop()
            epoch = (await loop.run_in_executor(None, m.admin.broker_info)).epoch + 1
            at = time.monotonic()
            if kind == "switchover":
                await loop.run_in_executor(None, lambda: m.admin.handover(s1.name, epoch))
                new, other = s1, s2
            else:
                m.kill()
                new, other = await loop.run_in_executor(None, lambda: sorted(
                    [s1, s2], key=lambda s: s.admin.broker_info().log_end_offset, reverse=True))
                await loop.run_in_executor(None, other.admin.change_role, "slave", epoch, new.address)
            await loop.run_in_executor(None, new.admin.change_role, "master", epoch)
            promoted = time.monotonic()
            if kind == "switchover":
                await loop.run_in_executor(None, other.admin.change_role, "slave", epoch, new.address)
            await asyncio.sleep(seconds_after)
            stop.set()
            await task
            return at, promoted, new

        at, promoted, new = asyncio.run(run())
        window = [t for t in acks if t >= at - 1.0]
        stall = max((b - a for a, b in zip(window, window[1:])), default=None)
        with PullConsumer(new.address) as c:
            seen = {msg.body.decode() for msg in c.read_all(TOPIC)}
        return {"kind": kind, "replication": mode, "acknowledged": len(acked),
                "failed_operations": len(failed), "first_failure": failed[0] if failed else "",
                "acknowledged_lost": len(acked - seen), "write_stall_ms": round(stall * 1e3, 1) if stall else None,
                "event_to_promoted_ms": round((promoted - at) * 1e3, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="load before and after the event")
    ap.add_argument("--modes", default="ASYNC,SYNC")
    ap.add_argument("--quick", action="store_true", help="2 s before and after, for a smoke run")
    args = ap.parse_args()
    secs = 2.0 if args.quick else args.seconds
    rows = [one_run(kind, mode, secs, secs) for mode in args.modes.split(",") for kind in ("switchover", "failover")]
    print("\nmaster + 2 slaves, SYNC flush, one producer with 8 transactions in flight "
          "(failover: detection time not included)")
    print(f"{'event':11} {'replication':11} {'acked':>7} {'failed':>7} {'lost':>5} {'stall ms':>9} {'to promoted ms':>15}")
    for r in rows:
        print(f"{r['kind']:11} {r['replication']:11} {r['acknowledged']:>7} {r['failed_operations']:>7} "
              f"{r['acknowledged_lost']:>5} {r['write_stall_ms']!s:>9} {r['event_to_promoted_ms']:>15}")
    for r in rows:
        if r["first_failure"]:
            print(f"  {r['kind']} {r['replication']}: first failure: {r['first_failure']}")
    path = write_results("switchover", {"command": " ".join([sys.executable] + sys.argv), "machine": machine(),
                                        "runs": rows})
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
