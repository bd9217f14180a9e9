"""Load generator and tailing reader: one client process of a benchmark run.

Run by network.py as `python bench/broker/loadgen.py --mode tx|plain|tail ...`. The process connects,
prints READY, reads the shared start time (time.monotonic(), which is CLOCK_MONOTONIC and so
comparable between processes) on stdin, runs until the window closes, and writes its figures as JSON
to --out.

  tx     N AsyncTransactionProducer instances (one connection each), K coroutines per producer, each a
         closed loop of send_message_in_transaction (half send + acknowledged COMMIT) of --batch
         messages. The listener commits; with --record-commits it notes time.monotonic() just before
         END_TRANSACTION is sent (execute_local_transaction runs right before it). --pipelined-end:
         each loop goes on while its END is on its way, and counts it once acknowledged.
  plain  the same with AsyncProducer.send (no transaction).
  tail   one AsyncPullConsumer long-polling (pull(..., wait_ms)) every queue of the topic from its end;
         notes when each message arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid

from common import RandomBodies
from txbroker.client import (
    AsyncProducer, AsyncPullConsumer, AsyncTransactionProducer, LocalTransactionState, Message, TransactionListener,
)

monotonic = time.monotonic


class CommitListener(TransactionListener):
    def __init__(self, record: bool):
        self.record = record
        self.commit_at: dict[str, float] = {}

    def execute_local_transaction(self, msg, arg):
        if self.record:
            first = msg[0] if isinstance(msg, list) else msg
            self.commit_at[first.transaction_id] = monotonic()
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT


class Window:
    def __init__(self, start: float, warmup: float, duration: float):
        self.start = start
        self.open = start + warmup
        self.close = self.open + duration


async def wait_start() -> float:
    print("READY", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return float(line)


async def run_producers(args) -> dict:
    bodies = RandomBodies(args.size)
    body = bodies.next
    listener = CommitListener(args.record_commits)
    group = f"bench-{args.mode}"
    producers = []
    for _ in range(args.producers):
        if args.mode == "tx":
            p = AsyncTransactionProducer(group, args.broker, listener, request_timeout=args.timeout,
                                         wait_end=not args.pipelined_end)
        else:
            p = AsyncProducer(group, args.broker, request_timeout=args.timeout)
        await p.start()
        producers.append(p)
    start = await wait_start()
    win = Window(start, args.warmup, args.duration)
    lat: list[float] = []
    done_in_window = 0
    errors: dict[str, int] = {}
    coroutines = args.producers * args.inflight
    interval = coroutines / args.rate if args.rate > 0 else 0.0
    topic, batch = args.topic, args.batch
    record_acks = args.record_commits and args.mode == "tx"
    acked_at: dict[str, float] = {}

    def count(t0: float, t1: float, txid: str) -> None:
        nonlocal done_in_window
        if record_acks:
            acked_at[txid] = t1
        if t0 >= win.open:
            lat.append((t1 - t0) * 1000.0)
        if win.open <= t1 <= win.close:
            done_in_window += 1

    def failed(r) -> bool:
        if r.send_status != "SEND_OK" or r.end_error or r.local_state is not LocalTransactionState.COMMIT:
            key = f"{r.send_status} {r.end_error[:80]}"
            errors[key] = errors.get(key, 0) + 1
            return True
        return False

    def ended(r, t0: float, txid: str) -> None:
        """--pipelined-end: a transaction counts once its END is acknowledged, not when the call returns."""
        if not failed(r):
            count(t0, monotonic(), txid)

    async def loop(p, index: int) -> None:
        now = monotonic()
        if now < win.start:
            await asyncio.sleep(win.start - now)
        next_at = win.start + (index * interval / coroutines if interval else 0.0)
        while True:
            if interval:
                now = monotonic()
                if next_at > now:
                    await asyncio.sleep(next_at - now)
                next_at += interval
            t0 = monotonic()
            if t0 >= win.close:
                return
            # random ids, as the client library makes by default (uuid4().hex): sequential ones would
            # sort after every stored id and make the broker's lookups unrealistically cheap
            txid = uuid.uuid4().hex
            msgs = [Message(topic, body()) for _ in range(batch)]
            try:
                if args.mode == "tx":
                    r = await p.send_message_in_transaction(msgs if batch > 1 else msgs[0],
                                                            transaction_id=txid)
                    if r.ended is not None:   # --pipelined-end: counted when acknowledged
                        r.ended.add_done_callback(lambda _f, r=r, t0=t0, txid=txid: ended(r, t0, txid))
                        continue
                    if failed(r):
                        continue
                else:
                    await p.send(msgs if batch > 1 else msgs[0])
            except Exception as e:  # noqa: BLE001 - count and go on; the report shows them
                key = f"{type(e).__name__}: {str(e)[:120]}"
                errors[key] = errors.get(key, 0) + 1
                await asyncio.sleep(0.01)
                continue
            count(t0, monotonic(), txid)

    tasks = [asyncio.ensure_future(loop(p, i * args.inflight + k))
             for i, p in enumerate(producers) for k in range(args.inflight)]
    await asyncio.gather(*tasks)
    for p in producers:
        await p.close()
    out = {"ops_in_window": done_in_window, "messages_per_op": batch, "latency_ms": lat, "errors": errors}
    if args.record_commits:
        out["commit_at"] = listener.commit_at
        out["acked_at"] = acked_at
    return out


async def run_tail(args) -> dict:
    consumer = AsyncPullConsumer(args.broker, request_timeout=args.timeout)
    queues = await consumer.queue_count(args.topic)
    offsets = {}
    for q in range(queues):
        offsets[q] = (await consumer.pull(args.topic, q, 0, 1)).max_offset
    start = await wait_start()
    win = Window(start, args.warmup, args.duration)
    stop_at = win.close + args.grace
    seen: set[str] = set()
    arrivals: dict[str, float] = {}  # transaction id -> arrival of its first message
    dup = 0
    received = 0

    async def follow(q: int) -> None:
        nonlocal dup, received
        offset = offsets[q]
        while True:
            left = stop_at - monotonic()
            if left <= 0:
                return
            r = await consumer.pull(args.topic, q, offset, 256, wait_ms=max(1, min(args.wait_ms, int(left * 1000))))
            now = monotonic()
            for m in r.messages:
                if m.msg_id in seen:
                    dup += 1  # invariant I3: a committed message lands exactly once
                seen.add(m.msg_id)
                if m.transaction_id and m.transaction_id not in arrivals:
                    arrivals[m.transaction_id] = now
                received += 1
            offset = r.next_offset

    await asyncio.gather(*(follow(q) for q in range(queues)))
    await consumer.close()
    return {"received": received, "duplicates": dup, "arrivals": arrivals, "queues": queues}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--mode", choices=["tx", "plain", "tail"], required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--inflight", type=int, default=1, help="coroutines per producer (pipelined on its connection)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rate", type=float, default=0.0, help="operations/s of this process (0: closed loop)")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--grace", type=float, default=3.0, help="tail: keep reading this long after the window")
    ap.add_argument("--wait-ms", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--record-commits", action="store_true")
    ap.add_argument("--pipelined-end", action="store_true",
                    help="tx: the next transaction starts while the last END_TRANSACTION is on its way (wait_end=False); "
                         "each counts once its END is acknowledged")
    ap.add_argument("--worker-id", default="w0")
    ap.add_argument("--no-uvloop", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    factory = None
    if not args.no_uvloop:
        try:
            import uvloop
            factory = uvloop.new_event_loop
        except ImportError:
            pass
    coro = run_tail(args) if args.mode == "tail" else run_producers(args)
    with asyncio.Runner(loop_factory=factory) as runner:
        out = runner.run(coro)
    out["pid"] = os.getpid()
    with open(args.out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
