#!/usr/bin/env python3
"""Run every Apache RocketMQ peer workload and write bench/results/rocketmq-<timestamp>.json.

    .venv/bin/python bench/rocketmq/run.py            # full: 20 s per case after 5 s warm-up
    .venv/bin/python bench/rocketmq/run.py --quick    # smoke test: 3 s per case

For each flush mode (ASYNC_FLUSH, SYNC_FLUSH) it starts a fresh RocketMQ (name server + broker, see
peer.py) with documented defaults and runs workloads 1-4, then a second fresh broker with
transactionCheckInterval=5000 ms for the check-back workloads (2 at 5 s, 2b). Optionally
(--python-client) it also starts the proxy in local mode and drives transactions from the Python
client (python_client.py). Every process is stopped at the end, also on errors and Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peer import DEFAULT_VERSION, RocketMQPeer, fetch  # noqa: E402
import workloads as W  # noqa: E402

REPO = HERE.parent.parent
RESULTS = REPO / "bench" / "results"


def machine() -> dict:
    def cpu_model():
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor()

    def mem_total_gib():
        try:
            for line in open("/proc/meminfo"):
                if line.startswith("MemTotal"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
        except OSError:
            return None

    java = subprocess.run(["java", "-version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    return {
        "nproc": os.cpu_count(),
        "memory_gib": mem_total_gib(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "java_version": java.strip().splitlines(),
        "python": sys.version.split()[0],
        "loadavg_at_start": os.getloadavg(),
    }


def fmt(v, nd=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def table(entries: list[dict]) -> str:
    hdr = ["flush", "wl", "case", "ops/s", "avg ms", "p50", "p99", "max", "fail", "extra"]
    rows = []
    for e in entries:
        if e.get("is_warmup"):
            continue
        f = e.get("figures") or {}
        lat = f.get("latency", {})
        extra = ""
        tx = f.get("tx")
        if tx and (tx.get("local_unknown") or 0) > 0:
            r = tx.get("all_resolved_after_send_end_s")
            extra = (f"unknown={tx['local_unknown']} checks={tx['checks']} unresolved={tx['unknown_unresolved_at_end']} "
                     f"all-resolved {fmt(r) if r is not None else 'NOT'} s after sends; "
                     f"unknown->resolved p50/max {fmt(tx['unknown_to_resolved'].get('p50_ms', 0) / 1000)}"
                     f"/{fmt(tx['unknown_to_resolved'].get('max_ms', 0) / 1000)} s")
        c = f.get("consume")
        if c and tx and (tx.get("local_unknown") or 0) > 0:
            extra += f"; delivered {c['delivered']}/{c['expected']} dup={c['duplicates']} rolled-back-delivered={c['rolled_back_delivered']}"
        elif c:
            k = "commit_decision_to_delivery" if f.get("mode") == "tx" else "send_start_to_delivery"
            d = c.get(k, {})
            extra = (f"{'commit' if f.get('mode') == 'tx' else 'send'}->deliver avg/p50/p99/max "
                     f"{fmt(d.get('avg_ms'))}/{fmt(d.get('p50_ms'))}/{fmt(d.get('p99_ms'))}/{fmt(d.get('max_ms'))} ms; "
                     f"delivered {c['delivered']}/{c['expected']} dup={c['duplicates']}")
        if f.get("driver") == "pyclient_bench":
            extra = (f"python client via gRPC proxy; half-send p50 {fmt(f['latency_half_send'].get('p50_ms'), 2)} ms, "
                     f"commit call p50 {fmt(f['latency_commit_call'].get('p50_ms'), 2)} ms; "
                     f"topic holds {f.get('topic_messages_stored')} of {f.get('committed_total_incl_warmup')} committed")
        if e.get("error"):
            extra = "ERROR: " + e["error"]
        rows.append([e.get("flush", ""), e["workload"], e["name"], fmt(f.get("ops_per_s")), fmt(lat.get("avg_ms"), 2),
                     fmt(lat.get("p50_ms"), 2), fmt(lat.get("p99_ms"), 2), fmt(lat.get("max_ms"), 1),
                     fmt(f.get("failed")), extra])
    widths = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr) - 1)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(hdr, widths)) + "  " + hdr[-1]]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few seconds per case (smoke test)")
    ap.add_argument("--flush", choices=["ASYNC_FLUSH", "SYNC_FLUSH", "both"], default="both")
    ap.add_argument("--no-fast-check", action="store_true",
                    help="skip the second broker with transactionCheckInterval=5000 ms")
    ap.add_argument("--python-client", action="store_true",
                    help="also run python_client.py (rocketmq-python-client via the proxy in local mode)")
    ap.add_argument("--only", default=None,
                    help="comma-separated workload ids to run (1,2,2b,3,4; 5 = python client, needs --python-client)")
    ap.add_argument("--out", default=None, help="output JSON path (default bench/results/rocketmq-<ts>.json)")
    ap.add_argument("--version", default=DEFAULT_VERSION, help=f"RocketMQ version (pinned {DEFAULT_VERSION})")
    a = ap.parse_args()

    # SIGTERM/SIGHUP -> exception, so every `with RocketMQPeer()` block stops its processes
    def _term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGHUP, _term)

    timing = W.Timing.quick() if a.quick else W.Timing()
    only = set(a.only.split(",")) if a.only else None
    flushes = ["ASYNC_FLUSH", "SYNC_FLUSH"] if a.flush == "both" else [a.flush]
    ts = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_path = Path(a.out) if a.out else RESULTS / f"rocketmq-{ts}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)

    fetch(a.version)  # fail early if the libraries cannot be had
    report = {
        "peer": "Apache RocketMQ",
        "rocketmq_version": a.version,
        "started_utc": ts,
        "quick": a.quick,
        "timing": timing.__dict__,
        "machine": machine(),
        "driver": ("bench/rocketmq/java/TxBench.java: txbroker's own re-implementation of RocketMQ's "
                   "example.benchmark.TransactionProducer/Producer/Consumer workload on rocketmq-client "
                   f"{a.version} (rocketmq-example is not published on Maven Central for 4.3+/5.x)"),
        "notes": [
            "RocketMQ sends END_TRANSACTION one-way (unacknowledged): transactional ops/s and latency cover "
            "half-message send round trip + local transaction + writing END_TRANSACTION to the socket, not "
            "the broker applying the commit.",
            "Broker, name server and the benchmark client share one machine; the client's CPU use competes "
            "with the broker's.",
            "Counts in figures.tx and figures.consume cover the whole run including warm-up; ops_per_s and "
            "latency cover only the measured window.",
        ],
        "peers": [],
        "results": [],
    }

    def save():
        tmp = out_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(out_path)

    def add(entry):
        report["results"].append(entry)
        save()

    interrupted = False
    try:
        for flush in flushes:
            plans = [({}, W.default_broker_cases(timing))]
            if not a.no_fast_check:
                plans.append((W.FAST_CHECK_OVERRIDES, W.fast_check_cases(timing)))
            for overrides, cases in plans:
                if only:
                    cases = [c for c in cases if c.workload in only]
                if not cases:
                    continue
                with RocketMQPeer(version=a.version, flush=flush, broker_overrides=overrides) as mq:
                    report["peers"].append(mq.describe())
                    W.run_cases(mq, cases, timing, on_entry=add)
            if a.python_client and (not only or "5" in only):
                import python_client as PC
                with RocketMQPeer(version=a.version, flush=flush, proxy=True) as mq:
                    report["peers"].append(mq.describe())
                    PC.run_all(mq, timing, on_entry=add)
    except KeyboardInterrupt as e:
        interrupted = True
        report["interrupted"] = str(e) or "KeyboardInterrupt"
    finally:
        report["machine"]["loadavg_at_end"] = os.getloadavg()
        report["finished_utc"] = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        save()

    print()
    print(f"Apache RocketMQ {a.version} peer, {'QUICK ' if a.quick else ''}results -> {out_path}")
    print("(END_TRANSACTION is one-way in RocketMQ: tx ops/s and latency exclude the commit acknowledgement)")
    print(table(report["results"]))
    failed = [e for e in report["results"] if e.get("error") or e.get("returncode") not in (0, None)]
    if failed or interrupted:
        print(f"{len(failed)} case(s) failed{' (interrupted)' if interrupted else ''}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
