"""`make demo`: a real broker-only run of the main flow (Spark joins it in its own issue).

Starts a broker process with SYNC flush on a temporary directory, publishes orders
transactionally with the seeds' listener (local transactions that commit, roll back, or stay
unknown until check-back), kills the broker with SIGKILL mid-way and restarts it, lets check-back
settle every transaction, and verifies with a reader that exactly the committed orders arrived,
once each.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter

from txbroker.client import (
    LocalTransactionState as S, Message, PullConsumer, TransactionListener, TransactionProducer,
)
from txbroker.client.admin import AdminClient

ORDERS = 300
TOPIC = "Orders"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OrderService(TransactionListener):
    """Order i: ROLLBACK if i % 7 == 0, else COMMIT; every third answers UNKNOWN first (a lost END)."""

    def __init__(self):
        self.decisions: dict[str, S] = {}
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg, i):
        decision = S.ROLLBACK if i % 7 == 0 else S.COMMIT
        with self.lock:
            self.decisions[msg.transaction_id] = decision
        return S.UNKNOWN if i % 3 == 0 else decision

    def check_local_transaction(self, msg):
        with self.lock:
            return self.decisions.get(msg.transaction_id, S.ROLLBACK)


def start_broker(data: str, port: int, admin: int) -> subprocess.Popen:
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "txbroker"), "broker", "--data-dir", data,
                             "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
                             "--flush-disk-type", "SYNC", "--check-interval-ms", "500",
                             "--transaction-timeout-ms", "300", "--log-level", "WARNING"])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=1):
                return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit("broker did not become ready")


def main() -> int:
    data = tempfile.mkdtemp(prefix="txbroker-demo-")
    port, admin_port = _port(), _port()
    addr = f"127.0.0.1:{port}"
    print(f"[demo] broker on {addr} (SYNC flush), data in {data}")
    t0 = time.monotonic()
    proc = start_broker(data, port, admin_port)
    service = OrderService()
    acked_commits: set[str] = set()
    try:
        with TransactionProducer("order-service", addr, service) as producer:
            for i in range(ORDERS // 2):
                r = producer.send_message_in_transaction(Message(TOPIC, f"order-{i}".encode(), keys=f"order-{i}"), i)
                if r.local_state is S.COMMIT and not r.end_error:
                    acked_commits.add(f"order-{i}")
            print(f"[demo] {ORDERS // 2} orders sent; kill -9 the broker and restart it on the same data")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc = start_broker(data, port, admin_port)
        admin = AdminClient(f"127.0.0.1:{admin_port}")
        print(f"[demo] broker recovered: {admin.transactions().total} transactions awaiting check-back")
        with TransactionProducer("order-service", addr, service) as producer:
            for i in range(ORDERS // 2, ORDERS):
                r = producer.send_message_in_transaction(Message(TOPIC, f"order-{i}".encode(), keys=f"order-{i}"), i)
                if r.local_state is S.COMMIT and not r.end_error:
                    acked_commits.add(f"order-{i}")
            deadline = time.monotonic() + 60
            while (left := admin.transactions().total) and time.monotonic() < deadline:
                print(f"[demo] waiting for check-back: {left} undecided", flush=True)
                time.sleep(1)
        with PullConsumer(addr) as reader:
            seen = Counter(m.body.decode() for m in reader.read_all(TOPIC))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        shutil.rmtree(data, ignore_errors=True)
    with service.lock:
        should = {f"order-{i}" for i in range(ORDERS) if i % 7 != 0}
    rolled_back = {f"order-{i}" for i in range(ORDERS) if i % 7 == 0}
    rows = [
        ("orders published", ORDERS),
        ("decided COMMIT", len(should)),
        ("decided ROLLBACK", len(rolled_back)),
        ("commits acknowledged directly", len(acked_commits)),
        ("resolved by check-back", len(should) - len(acked_commits)),
        ("delivered to the reader", sum(seen.values())),
        ("delivered more than once", sum(1 for n in seen.values() if n > 1)),
        ("rolled back yet delivered", len(rolled_back & set(seen))),
        ("committed yet missing", len(should - set(seen))),
    ]
    print("\n  verification                      count")
    for name, n in rows:
        print(f"  {name:32} {n:>6}")
    ok = set(seen) == should and all(n == 1 for n in seen.values())
    print(f"\n[demo] {'OK: every committed order arrived exactly once, no rolled-back one' if ok else 'FAILED'}"
          f" ({time.monotonic() - t0:.1f}s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
