"""Single-message transactions from Apache RocketMQ's Python client (rocketmq-python-client, gRPC to
the proxy). Runs inside its own virtualenv (python_client.py makes it); prints "STAT ..." lines and
one "RESULT {json}" line, like TxBench.

    python pyclient_bench.py --endpoint 127.0.0.1:8081 --topic T --concurrency 8 --duration 20

Each of --concurrency threads loops: begin_transaction(); send(half message, transaction=tx);
tx.commit(). One Producer is shared by all threads (the client is thread-safe and multiplexes one
gRPC channel). Latency is measured per transaction (send + commit) and for each step. Unlike the
Java remoting client, the gRPC client waits for the proxy's EndTransaction response; the proxy
(5.3.x) forwards END_TRANSACTION to the broker one-way, so the commit is still not acknowledged by
the broker itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time


def pct(sorted_vals, p):
    if not sorted_vals:
        return None
    import math
    i = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100 * len(sorted_vals)) - 1))
    return sorted_vals[i]


def summary(vals_s):
    v = sorted(vals_s)
    if not v:
        return {"count": 0}
    ms = lambda x: round(x * 1000, 3)  # noqa: E731
    return {"count": len(v), "avg_ms": ms(sum(v) / len(v)), "min_ms": ms(v[0]), "p50_ms": ms(pct(v, 50)),
            "p90_ms": ms(pct(v, 90)), "p99_ms": ms(pct(v, 99)), "p999_ms": ms(pct(v, 99.9)), "max_ms": ms(v[-1])}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--report", type=float, default=5)
    a = ap.parse_args()

    import logging
    logging.disable(logging.WARNING)   # the client logs every request at INFO
    from rocketmq import ClientConfiguration, Credentials, Message, Producer, TransactionChecker
    from rocketmq.grpc_protocol import TransactionResolution

    checks = {"n": 0}

    class Checker(TransactionChecker):
        def check(self, message):
            checks["n"] += 1
            return TransactionResolution.COMMIT

    cfg = ClientConfiguration(a.endpoint, Credentials())
    producer = Producer(cfg, (a.topic,), Checker())
    t_start = time.perf_counter()
    producer.startup()
    startup_s = time.perf_counter() - t_start

    body = os.urandom(a.size)
    lock = threading.Lock()
    lat_tx, lat_send, lat_commit = [], [], []
    errors: dict[str, int] = {}
    state = {"measuring": False, "stop": False, "ok": 0, "failed": 0, "committed_total": 0}

    def worker():
        l_tx, l_send, l_commit = [], [], []
        while not state["stop"]:
            t0 = time.perf_counter()
            try:
                tx = producer.begin_transaction()
                m = Message()
                m.topic = a.topic
                m.body = body
                producer.send(m, transaction=tx)
                t1 = time.perf_counter()
                tx.commit()
                t2 = time.perf_counter()
                with lock:
                    state["committed_total"] += 1
                if state["measuring"]:
                    l_tx.append(t2 - t0)
                    l_send.append(t1 - t0)
                    l_commit.append(t2 - t1)
                    with lock:
                        state["ok"] += 1
            except Exception as e:  # noqa: BLE001
                if state["measuring"]:
                    with lock:
                        state["failed"] += 1
                        k = type(e).__name__ + ": " + str(e)[:80]
                        errors[k] = errors.get(k, 0) + 1
                time.sleep(0.01)
        with lock:
            lat_tx.extend(l_tx)
            lat_send.extend(l_send)
            lat_commit.extend(l_commit)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    time.sleep(a.warmup)
    state["measuring"] = True
    m0 = time.perf_counter()
    last_ok, last_t = 0, m0
    end = m0 + a.duration
    while time.perf_counter() < end:
        time.sleep(min(a.report, max(0.0, end - time.perf_counter())))
        now = time.perf_counter()
        ok = state["ok"]
        print(f"STAT t={now - m0:.1f} tps={(ok - last_ok) / max(1e-9, now - last_t):.1f} failed={state['failed']}",
              flush=True)
        last_ok, last_t = ok, now
    state["measuring"] = False
    m1 = time.perf_counter()
    state["stop"] = True
    for t in threads:
        t.join(10)
    window = m1 - m0
    import importlib.metadata as md
    res = {
        "driver": "pyclient_bench",
        "client": f"rocketmq-python-client {md.version('rocketmq-python-client')} (grpcio {md.version('grpcio')})",
        "python": sys.version.split()[0],
        "mode": "tx",
        "threads": a.concurrency,
        "size": a.size,
        "window_s": round(window, 3),
        "ok": state["ok"],
        "failed": state["failed"],
        "ops_per_s": round(state["ok"] / window, 3),
        "latency": summary(lat_tx),
        "latency_half_send": summary(lat_send),
        "latency_commit_call": summary(lat_commit),
        "failures": errors,
        "checks": checks["n"],
        "committed_total_incl_warmup": state["committed_total"],
        "producer_startup_s": round(startup_s, 3),
        "end_transaction": "acknowledged by the proxy; proxy->broker is one-way (endTransactionOneway)",
    }
    print("RESULT " + json.dumps(res), flush=True)
    try:
        producer.shutdown()
    except Exception:  # noqa: BLE001
        pass
    os._exit(0)  # do not wait for the client's non-daemon threads


if __name__ == "__main__":
    sys.exit(main())
