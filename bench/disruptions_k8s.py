"""Four disruptions of a TxBroker on the real node, side by side (issue 32, item 5): what the clients
see (operations that failed, acknowledged commits lost) and how long writes stall.

    bash testbed/cluster.sh up
    bash testbed/cluster.sh exec .venv/bin/python bench/disruptions_k8s.py [--only rolling,switchover,drain,failover]

Each on a fresh TxBroker of 3 brokers (SYNC replication and flush) run by the operator in its pod,
one producer with 8 transactions in flight through the master Service (kube-proxy sends each new
connection to the master of the moment, as for any client in the cluster; `--via pods`: the three
pods' addresses instead, the client finding the master among them):

- **rolling**: `spec.image` changed (the broker image under another tag, as a registry's newer
  build): slaves replaced one at a time, a switchover, the old master replaced;
- **switchover**: the annotation `txbroker.dev/switchover=<name>-2`;
- **drain**: the master pod evicted through the eviction API, as `kubectl drain` does;
- **failover**: the master's container killed (SIGKILL through containerd, as the OOM killer would)
  and again at each restart, until the operator promotes a slave (detection and its grace period,
  `failover.gracePeriodSeconds`, here 5 s, are in this figure).

Write stall: the longest gap between two consecutive acknowledged commits from 1 s before the event
until the load stops. Failed operations: transactions that raised or whose END_TRANSACTION was not
acknowledged. Lost: acknowledged commits not visible on the master at the end. Done: from the event
until the TxBroker is Running again with every slave in sync.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "tests"), str(ROOT)]

from bench.cluster import machine, write_results  # noqa: E402
from cluster import VERSION, Cluster  # noqa: E402
from operator_env import IMAGE, InClusterOperator, broker_info, txbroker  # noqa: E402
from support.waiting import wait_until  # noqa: E402
from txbroker.client import (  # noqa: E402
    AsyncTransactionProducer, ClientError, LocalTransactionState as S, Message, PullConsumer, TransactionListener,
)

NAME, TOPIC, KINDS = "dis", "Disrupt", ("rolling", "switchover", "drain", "failover")


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return S.COMMIT

    def check_local_transaction(self, msg):
        return S.COMMIT


class Load:
    """One producer, 8 transactions in flight, in a thread of its own; ack times kept."""

    def __init__(self, addresses: list[str]):
        self.addresses, self.acks, self.acked, self.failed = addresses, [], set(), []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self):
        p = await AsyncTransactionProducer("bench-pg", self.addresses, Commit(), request_timeout=15).start()
        counter = iter(range(10**9))

        async def worker():
            while not self.stop.is_set():
                body = f"tx-{next(counter)}"
                try:
                    r = await p.send_message_in_transaction(Message(TOPIC, body.encode()), None)
                except ClientError as e:
                    self.failed.append(f"{body}: {e}")
                    continue
                if r.end_error or r.send_status != "SEND_OK":
                    self.failed.append(f"{body}: {r.end_error or r.send_status}")
                elif r.local_state is S.COMMIT:
                    self.acks.append(time.monotonic())
                    self.acked.add(body)

        await asyncio.gather(*(worker() for _ in range(8)))
        await p.close()


def healthy(tb, ns: str, image: str):
    t = tb.get("txb", NAME, ns)
    st = (t or {}).get("status") or {}
    pods = [tb.get("pod", f"{NAME}-{i}", ns) for i in range(3)]
    return (st.get("phase") == "Running" and not (st.get("groups") or [{}])[0].get("switchover")
            and all(p and p["spec"]["containers"][0]["image"] == image and not p["metadata"].get("deletionTimestamp")
                    for p in pods)
            and sum(1 for b in st.get("brokers", []) if b["role"] == "slave" and b.get("inSync")) == 2 and t)


def evict(tb, ns: str, pod: str) -> bool:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}}
    return tb.kubectl("create", "--raw", f"/api/v1/namespaces/{ns}/pods/{pod}/eviction", "-f", "-",
                      input=json.dumps(body), check=False).returncode == 0


def kill_container(tb, ns: str, pod: str) -> None:
    """SIGKILL to the pod's running broker container, through containerd."""
    for s in ((tb.get("pod", pod, ns) or {}).get("status") or {}).get("containerStatuses") or []:
        if "running" in (s.get("state") or {}) and s.get("containerID"):
            tb.run("ctr", "-a", tb.sock, "-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL",
                   s["containerID"].split("://", 1)[1], check=False)


def disrupt(kind: str, tb, ns: str) -> str:
    """Start the disruption; return the image the TxBroker runs once it is over."""
    master = tb.get("txb", NAME, ns)["status"]["master"]
    if kind == "rolling":
        tb.kubectl("-n", ns, "patch", "txb", NAME, "--type", "merge", "-p", json.dumps({"spec": {"image": "txbroker/broker:v2"}}))
        return "txbroker/broker:v2"
    if kind in ("switchover", "drain"):
        if kind == "switchover":
            tb.kubectl("-n", ns, "annotate", "txb", NAME, f"txbroker.dev/switchover={NAME}-2")
        else:
            wait_until(lambda: evict(tb, ns, master), 60, f"the eviction of {master} accepted")
        wait_until(lambda: tb.get("txb", NAME, ns)["status"].get("master") not in (master, None), 120,
                   f"mastership to move away from {master}", interval=0.1)
    else:   # failover: killed until a slave is promoted (a crash-looping master)
        def promoted():
            if (tb.get("txb", NAME, ns)["status"].get("master") or master) != master:
                return True
            kill_container(tb, ns, master)
            return False
        wait_until(promoted, 180, "the operator to fail over", interval=0.5)
    return IMAGE


def one_run(kind: str, tb, seconds: float, logs: str | None = None, via: str = "service") -> dict:
    op = InClusterOperator(tb, f"bench-{kind}-{int(time.time()) % 100000}", 1)
    ns = op.namespace
    try:
        tb.apply(txbroker(NAME, replicas=3, replication="SYNC", flush="SYNC", failover={"gracePeriodSeconds": 5},
                          transaction={"checkIntervalSeconds": 1, "timeoutSeconds": 1, "checkMax": 300}), ns)
        wait_until(lambda: healthy(tb, ns, IMAGE), 240, f"TxBroker {NAME} Running, slaves in sync")
        service = f"{tb.get('service', f'{NAME}-master', ns)['spec']['clusterIP']}:10911"
        pods = [f"{tb.get('pod', f'{NAME}-{i}', ns)['status']['podIP']}:10911" for i in range(3)]
        load = Load([service] if via == "service" else pods)
        load.thread.start()
        wait_until(lambda: len(load.acked) >= 200, 60, "load on the master")
        time.sleep(seconds)   # a steady stretch before the event, for the stall window's baseline
        at, wall = time.monotonic(), time.strftime("%H:%M:%S", time.gmtime())
        image = disrupt(kind, tb, ns)
        wait_until(lambda: healthy(tb, ns, image), 600, f"{NAME} Running again on {image}", interval=0.5)
        done = time.monotonic()
        time.sleep(seconds)
        load.stop.set()
        load.thread.join(120)
        master = tb.get("txb", NAME, ns)["status"]["master"]
        ip = tb.get("pod", master, ns)["status"]["podIP"]
        wait_until(lambda: broker_info(tb, ns, master)["pending_transactions"] == 0, 120, "nothing pending")
        with PullConsumer(f"{ip}:10911") as c:
            seen = {m.body.decode() for m in c.read_all(TOPIC)}
        window = [t for t in load.acks if t >= at - 1.0]
        gaps = [(b - a, a) for a, b in zip(window, window[1:])]
        stall, stall_start = max(gaps, default=(None, None))
        text = op.log.read_text()
        if logs:
            Path(logs, f"{kind}-operator.log").write_text(text)
        steps = [line for line in text.splitlines() if "DEBUG" not in line
                 and re.search(r"handed over|promoted|follows|labelled|switchover|failed over", line, re.I)]
        return {"kind": kind, "via": via, "acknowledged": len(load.acked), "failed_operations": len(load.failed),
                "first_failure": load.failed[0] if load.failed else "", "acknowledged_lost": len(load.acked - seen),
                "write_stall_ms": round(stall * 1e3, 1) if stall else None, "event_to_done_s": round(done - at, 1),
                "stall_began_s": round(stall_start - at, 2) if stall else None, "event_utc": wall,
                "operator_steps": steps[-12:]}
    finally:
        op.uninstall()
        tb.delete_namespace(ns)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(KINDS), help="which disruptions, comma-separated")
    ap.add_argument("--seconds", type=float, default=5.0, help="steady load before the event and after it is over")
    ap.add_argument("--logs", help="a directory to keep each run's operator log, and the client's debug log, in")
    ap.add_argument("--via", choices=("service", "pods"), default="service",
                    help="the producer's addresses: the master Service (default), or the three pods' IPs")
    args = ap.parse_args()
    if args.logs:
        Path(args.logs).mkdir(parents=True, exist_ok=True)
        logging.basicConfig(filename=str(Path(args.logs, "client.log")), level=logging.DEBUG,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tb = Cluster()
    tb.check_reachable()
    tb.kubectl("apply", "-f", str(ROOT / "crds"))
    tb.run("ctr", "-a", tb.sock, "-n", "k8s.io", "images", "tag", "--force", f"docker.io/{IMAGE}",
           "docker.io/txbroker/broker:v2")
    rows = []
    for kind in args.only.split(","):
        rows.append(one_run(kind, tb, args.seconds, args.logs, args.via))
        print(f"[disruptions] {kind}: {rows[-1]}", file=sys.stderr, flush=True)
    print("\nTxBroker of 3 (SYNC replication and flush) on the node, one producer with 8 transactions in flight "
          + (f"through {NAME}-master" if args.via == "service" else "given the three pods' addresses"))
    print(f"{'event':11} {'acked':>7} {'failed':>7} {'lost':>5} {'stall ms':>9} {'done s':>7}")
    for r in rows:
        print(f"{r['kind']:11} {r['acknowledged']:>7} {r['failed_operations']:>7} {r['acknowledged_lost']:>5} "
              f"{r['write_stall_ms']!s:>9} {r['event_to_done_s']:>7}")
    for r in rows:
        if r["first_failure"]:
            print(f"  {r['kind']}: first failure: {r['first_failure']}")
    path = write_results("disruptions-k8s", {"command": " ".join([sys.executable] + sys.argv), "machine": machine(),
                                             "version": VERSION, "runs": rows})
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
