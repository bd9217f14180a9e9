"""Workload 2 of bench/compare.py against txbroker: 1/3 of transactions answer UNKNOWN, check-back
resolves them. One client process, run by compare_txbroker.py:

    .venv/bin/python bench/compare_checkback.py --broker 127.0.0.1:10911 --topic T --producers 8 \
        --unknown 0.333 --warmup 5 --duration 10 --drain 60 --out result.json

The same shape as the RocketMQ driver's `TxBench tx -su 0.333 -cu 0 -drain 60 -consume`
(bench/rocketmq/java/TxBench.java), so the two can be set side by side:
  - `--producers` AsyncTransactionProducer instances of one group (one connection each) send
    single-message transactions in a closed loop for warm-up + duration; the local transaction answers
    UNKNOWN with probability `--unknown` (drawn per transaction), COMMIT otherwise;
  - every check-back answers COMMIT (on the client's check pool, as a user's listener would run);
  - after the sends stop, wait (at most `--drain` s) until check-back has resolved every UNKNOWN;
  - a tailing reader in the same process (as TxBench runs its push consumer in the same JVM)
    follows every queue from its end and checks that each committed message arrives exactly once.
The figures use TxBench's names (tx.local_unknown, tx.checks, tx.all_resolved_after_send_end_s,
tx.unknown_to_resolved ...). Check-backs are counted by the producers; the broker's own counter
(txbroker_checkbacks_sent) is read by the caller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "broker"))
from common import RandomBodies, percentiles  # noqa: E402  (bench/broker/common.py)
from txbroker.client import (  # noqa: E402
    AsyncPullConsumer, AsyncTransactionProducer, LocalTransactionState as S, Message, TransactionListener,
)

monotonic = time.monotonic


class Outcomes(TransactionListener):
    """The local transactions and the check-back answers, with the bookkeeping TxBench keeps."""

    def __init__(self, unknown: float, seed: int = 1):
        self.unknown = unknown
        self.rand = random.Random(seed).random
        self.lock = threading.Lock()  # check-backs run on the producers' check threads
        self.unknown_at: dict[str, float] = {}  # UNKNOWN, not yet resolved by a check
        self.resolved: set[str] = set()
        self.committed: set[str] = set()  # committed by the producer or by a check
        self.resolve_s: list[float] = []
        self.last_resolve = 0.0
        self.c = dict(local_commit=0, local_unknown=0, checks=0, check_commit=0, unexpected_checks=0,
                      duplicate_checks_after_resolution=0)

    def execute_local_transaction(self, msg, arg):
        txid = msg.transaction_id
        with self.lock:
            if self.rand() < self.unknown:
                self.unknown_at[txid] = monotonic()
                self.c["local_unknown"] += 1
                return S.UNKNOWN
            self.c["local_commit"] += 1
            self.committed.add(txid)
        return S.COMMIT

    def check_local_transaction(self, msg):
        txid = msg.transaction_id
        now = monotonic()
        with self.lock:
            self.c["checks"] += 1
            since = self.unknown_at.pop(txid, None)
            if since is None:
                key = "duplicate_checks_after_resolution" if txid in self.resolved else "unexpected_checks"
                self.c[key] += 1
            else:
                self.resolve_s.append(now - since)
                self.last_resolve = now
                self.resolved.add(txid)
                self.committed.add(txid)
            self.c["check_commit"] += 1
        return S.COMMIT


class Tail:
    """Follows every queue of the topic from its end; counts deliveries per transaction id."""

    def __init__(self, broker: str, topic: str):
        self.consumer = AsyncPullConsumer(broker, request_timeout=30)
        self.topic = topic
        self.seen_msg: set[str] = set()
        self.by_tx: dict[str, int] = {}
        self.redelivered = 0  # the same stored message again
        self.stop = False

    async def start(self) -> list[asyncio.Task]:
        queues = await self.consumer.queue_count(self.topic)
        offsets = [(await self.consumer.pull(self.topic, q, 0, 1)).max_offset for q in range(queues)]
        return [asyncio.ensure_future(self._follow(q, o)) for q, o in enumerate(offsets)]

    async def _follow(self, q: int, offset: int) -> None:
        while not self.stop:
            r = await self.consumer.pull(self.topic, q, offset, 256, wait_ms=500)
            for m in r.messages:
                if m.msg_id in self.seen_msg:
                    self.redelivered += 1
                    continue
                self.seen_msg.add(m.msg_id)
                self.by_tx[m.transaction_id] = self.by_tx.get(m.transaction_id, 0) + 1
            offset = r.next_offset


async def run(a) -> dict:
    out = Outcomes(a.unknown)
    body = RandomBodies(a.size).next
    group = f"cmp-checkback-{int(time.time())}"
    producers = [await AsyncTransactionProducer(group, a.broker, out, request_timeout=30).start()
                 for _ in range(a.producers)]
    tail = Tail(a.broker, a.topic)
    tail_tasks = await tail.start()
    t0 = monotonic()
    open_at, close_at = t0 + a.warmup, t0 + a.warmup + a.duration
    lat: list[float] = []
    done = 0
    errors: dict[str, int] = {}

    async def loop(p) -> None:
        nonlocal done
        while (s := monotonic()) < close_at:
            try:
                r = await p.send_message_in_transaction(Message(a.topic, body()))
            except Exception as e:  # noqa: BLE001 - count and go on
                k = f"{type(e).__name__}: {str(e)[:100]}"
                errors[k] = errors.get(k, 0) + 1
                await asyncio.sleep(0.01)
                continue
            e = monotonic()
            if r.send_status != "SEND_OK" or r.end_error:
                k = f"{r.send_status} {r.end_error[:80]}"
                errors[k] = errors.get(k, 0) + 1
                continue
            if s >= open_at:
                lat.append((e - s) * 1000.0)
            if open_at <= e <= close_at:
                done += 1

    await asyncio.gather(*(loop(p) for p in producers))
    sends_done = monotonic()
    pending_at_send_end = len(out.unknown_at)
    drain = []
    while out.unknown_at and monotonic() - sends_done < a.drain:
        await asyncio.sleep(0.1)
        t = monotonic() - sends_done
        if not drain or t - drain[-1]["t"] >= 5:
            drain.append({"t": round(t, 1), "pending_unknown": len(out.unknown_at), "checks": out.c["checks"]})
    drain_waited = monotonic() - sends_done
    expected = len(out.committed)
    deadline = monotonic() + a.consume_wait
    while sum(1 for t in out.committed if t in tail.by_tx) < expected and monotonic() < deadline:
        await asyncio.sleep(0.1)
    tail.stop = True
    await asyncio.gather(*tail_tasks, return_exceptions=True)
    await tail.consumer.close()
    for p in producers:
        await p.close()
    with out.lock:
        unresolved = len(out.unknown_at)
        delivered = sum(1 for t in out.committed if t in tail.by_tx)
        copies = sum(n - 1 for n in tail.by_tx.values() if n > 1)
        resolve = percentiles([x * 1000.0 for x in out.resolve_s])
        tx = dict(out.c)
    tx.update({
        "rates": {"su": a.unknown, "cu": 0.0},
        "unknown_pending_at_send_end": pending_at_send_end,
        "unknown_unresolved_at_end": unresolved,
        "drain_limit_s": a.drain,
        "drain_waited_s": round(drain_waited, 3),
        "all_resolved_after_send_end_s": (round(max(0.0, out.last_resolve - sends_done), 3)
                                          if not unresolved and out.last_resolve else None),
        "unknown_to_resolved": {f"{k}_ms" if k != "n" else "count": (round(v, 3) if isinstance(v, float) else v)
                                for k, v in resolve.items()},
        "end_transaction": "acknowledged",
    })
    return {
        "driver": "compare_checkback", "mode": "tx", "producers": a.producers, "size": a.size,
        "warmup_s": a.warmup, "window_s": a.duration, "ok": done, "ops_per_s": round(done / a.duration, 3),
        "latency": {f"{k}_ms" if k != "n" else "count": (round(v, 3) if isinstance(v, float) else v)
                    for k, v in percentiles(lat).items()},
        "failures": errors, "tx": tx, "drain_series": drain,
        "consume": {"reader": "AsyncPullConsumer tailing every queue, same process", "expected": expected,
                    "delivered": delivered, "duplicates": copies + tail.redelivered,
                    "duplicates_same_msg_id": tail.redelivered, "duplicates_other_copy": copies,
                    "received_total": len(tail.seen_msg)},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--unknown", type=float, default=0.333)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--drain", type=float, default=60.0)
    ap.add_argument("--consume-wait", type=float, default=20.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        doc = runner.run(run(a))
    Path(a.out).write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
