"""Consume throughput (one and four push consumers in a group, each in its own process) and
commit-to-delivery latency for a push consumer.

    .venv/bin/python bench/consumer_bench.py [--messages 100000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

from cluster import Broker, machine, percentile, workdir, write_results
from txbroker.client import (
    AsyncProducer, AsyncPushConsumer, AsyncTransactionProducer, ConsumeStatus, LocalTransactionState as S, Message,
    TransactionListener,
)

BODY = b"x" * 1024


async def fill(address: str, topic: str, n: int) -> None:
    async with AsyncProducer("bench-fill", address) as p:
        sends = [p.send([Message(topic, BODY) for _ in range(100)]) for _ in range(n // 100)]
        for i in range(0, len(sends), 16):
            await asyncio.gather(*sends[i:i + 16])


async def worker(address: str, group: str, topic: str, batch: int, idle_s: float) -> dict:
    """One group member: consume until nothing has arrived for `idle_s`, then report."""
    count, first, last = 0, None, None

    async def listener(msgs, ctx):
        nonlocal count, first, last
        now = time.time()
        first = first or now
        last = now
        count += len(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = await AsyncPushConsumer(group, address, topic, listener, consume_message_batch_max_size=batch,
                                pull_batch_size=256, heartbeat_interval=1, rebalance_interval=1,
                                offset_commit_interval=1, long_poll_ms=500).start()
    while first is None or time.time() - last < idle_s:
        await asyncio.sleep(0.1)
    await c.shutdown()
    return {"count": count, "first": first, "last": last}


def throughput(address: str, topic: str, members: int, batch: int, n: int) -> dict:
    group = f"bench-cg-{members}-{batch}"
    started = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", address, group, topic, str(batch)],
                              stdout=subprocess.PIPE, text=True) for _ in range(members)]
    results = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    total = sum(r["count"] for r in results)
    end = max(r["last"] for r in results)
    return {"members": members, "batch": batch, "consumed": total, "expected": n,
            "msgs_per_s": round(total / (end - started)), "seconds": round(end - started, 2)}


async def latency(address: str, n: int, rate: float) -> dict:
    """Commit-to-delivery: from just before END_TRANSACTION (commit) to the push consumer's listener."""
    sent_at: dict[bytes, float] = {}
    delays: list[float] = []
    done = asyncio.Event()

    async def listener(msgs, ctx):
        now = time.perf_counter()
        for m in msgs:
            if m.body in sent_at:
                delays.append(now - sent_at[m.body])
        if len(delays) >= n:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    class Commit(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            sent_at[msg.body] = time.perf_counter()  # the commit goes out right after this returns
            return S.COMMIT

    async with AsyncProducer("bench-warm", address) as p:
        await p.send(Message("Latency", b"warm-up"))
    c = await AsyncPushConsumer("bench-latency", address, "Latency", listener, long_poll_ms=15_000).start()
    async with AsyncTransactionProducer("bench-latency-pg", address, Commit()) as p:
        for i in range(n):
            await p.send_message_in_transaction(Message("Latency", f"{i:08d}".encode() + BODY[8:]), None)
            await asyncio.sleep(1 / rate)
        await asyncio.wait_for(done.wait(), 60)
    await c.shutdown()
    return {"transactions": n, "rate_per_s": rate, "p50_ms": round(percentile(delays, 50) * 1e3, 3),
            "p99_ms": round(percentile(delays, 99) * 1e3, 3), "max_ms": round(max(delays) * 1e3, 3)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        address, group, topic, batch = sys.argv[2:6]
        print(json.dumps(asyncio.run(worker(address, group, topic, int(batch), 1.5))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 10_000 if args.quick else args.messages
    with workdir() as (d, brokers):
        b = Broker(d, "broker").start()
        brokers.append(b)
        b.admin.create_topic("Consume", 8)
        asyncio.run(fill(b.address, "Consume", n))
        rows = [throughput(b.address, "Consume", members, batch, n) for members, batch in ((1, 1), (4, 1), (1, 32), (4, 32))]
        lat = asyncio.run(latency(b.address, 300 if args.quick else 2000, 200.0))
    print(f"\nconsume throughput, {n} messages of 1 KiB in 8 queues, push consumers in separate processes")
    print(f"{'members':>8} {'batch':>6} {'msgs/s':>9} {'consumed':>9}")
    for r in rows:
        print(f"{r['members']:>8} {r['batch']:>6} {r['msgs_per_s']:>9} {r['consumed']:>9}")
    print(f"\ncommit-to-delivery latency, push consumer (long poll), {lat['rate_per_s']:.0f} tx/s: "
          f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, max {lat['max_ms']} ms")
    path = write_results("consumer", {"command": " ".join([sys.executable] + sys.argv), "machine": machine(),
                                      "throughput": rows, "latency": lat})
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
