"""Transactions per second with ASYNC and SYNC replication beside a single broker, and the time
from kill -9 of the master to the first commit acknowledged by the new master.

    .venv/bin/python bench/replication_bench.py [--seconds 10] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from cluster import Broker, machine, percentile, workdir, write_results
from txbroker.client import AsyncTransactionProducer, ClientError, LocalTransactionState as S, Message, TransactionListener

BODY = b"x" * 1024


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return S.COMMIT

    def check_local_transaction(self, msg):
        return S.COMMIT


async def tx_load(addresses, seconds: float, concurrency: int = 8, record=None):
    """One pipelined producer with `concurrency` transactions in flight; returns (count, latencies)."""
    lat: list[float] = []
    p = await AsyncTransactionProducer("bench-pg", addresses, Commit(), request_timeout=15).start()
    end = time.monotonic() + seconds

    async def worker():
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                r = await p.send_message_in_transaction(Message("Bench", BODY), None)
            except ClientError:
                continue
            if not r.end_error and r.local_state is S.COMMIT:
                lat.append(time.perf_counter() - t0)
                if record is not None:
                    record(p.client.address)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await p.close()
    return len(lat), lat


def throughput(mode: str, seconds: float) -> dict:
    """`mode`: single, ASYNC, SYNC, or SYNC-controlled (as under the operator: the master counts the
    slaves its controller approved, the benchmark playing the controller)."""
    with workdir() as (d, brokers):
        args = ["--flush-disk-type", "ASYNC"]
        if mode != "single":
            args += ["--replication-mode", mode.split("-")[0]]
        if mode == "SYNC-controlled":
            args.append("--await-role-confirmation")
        m = Broker(d, "master", *args).start()
        brokers.append(m)
        if mode != "single":
            s = Broker(d, "slave", "--role", "slave", "--master", m.address).start()
            brokers.append(s)
            deadline = time.monotonic() + 20
            if mode == "SYNC-controlled":
                while not m.admin.broker_info().replication.slaves:
                    if time.monotonic() > deadline:
                        raise RuntimeError("slave never subscribed")
                    time.sleep(0.05)
                m.admin.put("/api/v1/replication/sync-set", {"epoch": 1, "slaves": ["slave"]})
            while not any(x.in_sync for x in m.admin.broker_info().replication.slaves):
                if time.monotonic() > deadline:
                    raise RuntimeError("slave never in sync")
                time.sleep(0.05)
        t0 = time.monotonic()
        n, lat = asyncio.run(tx_load([m.address], seconds))
        took = time.monotonic() - t0
        return {"mode": mode, "transactions": n, "tx_per_s": round(n / took), "p50_ms": round(percentile(lat, 50) * 1e3, 3),
                "p99_ms": round(percentile(lat, 99) * 1e3, 3)}


def failover(seconds_before: float) -> dict:
    with workdir() as (d, brokers):
        args = ["--flush-disk-type", "SYNC", "--replication-mode", "SYNC"]
        m = Broker(d, "master", *args).start()
        s1 = Broker(d, "slave1", "--role", "slave", "--master", m.address, *args).start()
        s2 = Broker(d, "slave2", "--role", "slave", "--master", m.address, *args).start()
        brokers += [m, s1, s2]
        while sum(x.in_sync for x in m.admin.broker_info().replication.slaves) < 2:
            time.sleep(0.05)
        acks: list[tuple[float, str]] = []

        async def run():
            load = asyncio.ensure_future(tx_load([m.address, s1.address, s2.address], seconds_before + 10,
                                                 record=lambda addr: acks.append((time.monotonic(), addr))))
            await asyncio.sleep(seconds_before)
            killed = time.monotonic()
            m.kill()
            loop = asyncio.get_running_loop()
            best, other = await loop.run_in_executor(None, lambda: sorted(
                [s1, s2], key=lambda s: s.admin.broker_info().local_durable_offset, reverse=True))
            epoch = (await loop.run_in_executor(None, best.admin.broker_info)).epoch + 1
            await loop.run_in_executor(None, best.admin.change_role, "master", epoch)
            promoted = time.monotonic()
            await loop.run_in_executor(None, other.admin.change_role, "slave", epoch, best.address)
            await load
            first = next((t for t, addr in acks if t > killed and addr == best.address), None)
            return {"kill_to_promoted_s": round(promoted - killed, 3),
                    "kill_to_first_commit_on_new_master_s": round(first - killed, 3) if first else None,
                    "commits_before_kill": sum(1 for t, _ in acks if t <= killed),
                    "commits_after_kill": sum(1 for t, _ in acks if t > killed)}

        return asyncio.run(run())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="2 s per figure, for a smoke run")
    args = ap.parse_args()
    secs = 2.0 if args.quick else args.seconds
    rows = [throughput(mode, secs) for mode in ("single", "ASYNC", "SYNC", "SYNC-controlled")]
    fo = failover(2.0 if args.quick else 5.0)
    print("\nsingle-message transactions, 1 KiB, one producer with 8 in flight, ASYNC flush")
    print(f"{'replication':16} {'tx/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for r in rows:
        print(f"{r['mode']:16} {r['tx_per_s']:>8} {r['p50_ms']:>8} {r['p99_ms']:>8}")
    print("\nfailover (1 master + 2 slaves, SYNC replication and flush, promotion called by the benchmark):")
    for k, v in fo.items():
        print(f"  {k:40} {v}")
    path = write_results("replication", {"command": " ".join([sys.executable] + sys.argv), "machine": machine(),
                                         "throughput": rows, "failover": fo})
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
