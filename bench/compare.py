#!/usr/bin/env python3
"""txbroker beside Apache RocketMQ 5.3.3, the same workloads one after the other (tracker issue 8).

    .venv/bin/python bench/compare.py            # full: 10 s measured after 5 s warm-up per case (~26 min)
    .venv/bin/python bench/compare.py --quick    # smoke run: 3 s per case (~17 min)
    .venv/bin/python bench/compare.py --flush ASYNC --only 1,2 --no-python-client --no-profile
    .venv/bin/python bench/compare.py --profile-only [--profile-producers 1,8]   # only the py-spy profile
    .venv/bin/python bench/compare.py --table-from bench/results/compare-<ts>.json  # print a result's tables
    .venv/bin/python bench/compare.py --groups 2 --flush ASYNC --only 1 --no-python-client --no-profile
                                                 # also 2 broker groups each side (tracker issue 18)

For each flush mode (ASYNC, then SYNC: `--flush-disk-type` for txbroker, `flushDiskType=*_FLUSH` for
RocketMQ) it runs every workload against txbroker (compare_txbroker.py: one broker process for the
mode, bench/broker's load generator; workload 2 on a second broker) and then against RocketMQ
(compare_rocketmq.py: bench/rocketmq's peer, TxBench driver and Python client), and prints one table
per flush mode (compare_report.py). 1 KiB bodies, 8 queues, concurrency 1/8/32. Workload 2 uses the
same check interval for both (--check-interval-ms, default 5000; transaction timeout 6 s and 15
checks at most are both systems' defaults). Afterwards (--no-profile to skip) the txbroker broker is
profiled with py-spy under the single-message transaction load (compare_profile.py). The broker
source is copied at the start and that copy is what every broker and client process of the run
imports (other engineers may commit to the clone during a run); its hash is in the JSON.

With --groups N (N >= 2; default 1: nothing added) workload 1 also runs on N broker groups each
side, after that flush mode's other cases: txbroker as N `txbroker broker --group` masters sharing
one route file (bench/groups_bench.py's Cluster), loaded through cluster producers (each transaction
whole to one group, the next in turn); RocketMQ as N masters of different brokerName under one name
server, the topic on all of them (bench/rocketmq/peer.py brokers=N). Broker CPU is all brokers'
summed; the table also says what share of the 2 cores the clients took.

Everything goes to bench/results/compare-<UTC timestamp>.json (saved after every case): machine,
versions, the exact command, every case's figures, raw results, commands and the load average / CPU
of other work on the machine during it (compare_meter.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH / "broker"), str(BENCH / "rocketmq")]

import compare_profile  # noqa: E402
import compare_report  # noqa: E402
import compare_rocketmq  # noqa: E402
import compare_txbroker  # noqa: E402
import python_client  # noqa: E402  (bench/rocketmq/python_client.py)
import workloads as W  # noqa: E402  (bench/rocketmq/workloads.py)
from common import RESULTS_DIR, loadavg, machine_info  # noqa: E402  (bench/broker/common.py)
from peer import DEFAULT_VERSION, fetch  # noqa: E402  (bench/rocketmq/peer.py)

NOTES = [
    "Both systems run on the same 2-core machine, one after the other, under the same conditions; other "
    "engineers' work ran at the same time: see meter.loadavg_* and meter.others_pct (CPU of processes not "
    "started by this benchmark, 100 = one core) of every case.",
    "RocketMQ's END_TRANSACTION is one-way: its transaction latency and tx/s cover the half send round trip, the "
    "local transaction and writing END_TRANSACTION to the socket. txbroker's cover the acknowledged commit too.",
    "Clients differ: RocketMQ is driven by TxBench (Java, bench/rocketmq/java/TxBench.java: one "
    "TransactionMQProducer, i.e. one connection, shared by N threads, in one JVM that can use both cores) and, "
    "for workload 1, by rocketmq-python-client through the proxy; txbroker by bench/broker/loadgen.py (Python, "
    "uvloop): N producers with one connection each, as coroutines in 1 process (2 processes for 32); for 8 and 32 "
    "also one producer with N transactions in flight on its one connection (case tx_cN_1conn: RocketMQ's layout).",
    "broker CPU us/op in the tables: CPU of the broker process (RocketMQ: broker JVM; Python-client rows: the proxy "
    "JVM holding the broker) over the case (meter.server_pct) per operation; it moves less with other load than "
    "the rates.",
    "txbroker's broker and clients run a copy of broker_image/txbroker made at the start (versions."
    "txbroker_source_sha256), put first on PYTHONPATH: the clone may change during a run.",
    "Per case: warm-up (not counted), then the measured window; RocketMQ's broker also gets untimed JIT warm-up "
    "load when it starts (workloads.warm_broker), txbroker needs none.",
    "Workload 3: txbroker's consumer is a tailing AsyncPullConsumer (long poll) in its own process; RocketMQ's a "
    "DefaultMQPushConsumer (4 threads) in the driver's JVM. Both measure from the local COMMIT decision (just "
    "before END_TRANSACTION is sent) to the message arriving. Light load: RocketMQ 1 thread with a 10 ms pause "
    "after each transaction, txbroker 1 producer paced to --light-rate tx/s.",
    "Workload 2: both drivers send single-message transactions from 8 concurrent senders for warm-up + window, "
    "1/3 of local transactions answer UNKNOWN, every check-back answers COMMIT, and a consumer in the same "
    "process checks delivery; tx/s during it include that consumer's cost on both sides.",
    "Workload 5: RocketMQ has no multi-message transaction; its figure is workload 1 (single message).",
    "Broker groups (--groups N, cases tx_c<n>_g<N>): N masters each side on the same 2 cores as the clients, so "
    "the figures show the cost per transaction and how the machine's ceiling is shared, not what N cores give; "
    "broker CPU us/op sums every broker process (meter.server_pct_each has each); meter.clients_pct is this "
    "benchmark's other processes (load generators; for RocketMQ also its name server).",
]


def versions() -> dict:
    java = subprocess.run(["java", "-version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    try:
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(BENCH.parent), "status", "--porcelain",
                                "--", "broker_image", "bench"], capture_output=True, text=True, timeout=10).stdout
        diff = subprocess.run(["git", "--no-optional-locks", "-C", str(BENCH.parent), "diff", "HEAD", "--",
                               "broker_image"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        dirty, diff = "", b""
    return {"rocketmq": DEFAULT_VERSION, "rocketmq_python_client": python_client.CLIENT_PIN,
            "java": java.strip().splitlines(), "python": sys.version.split()[0],
            "txbroker_git_commit": machine_info()["git_commit"],
            "txbroker_uncommitted_changes": dirty.splitlines(),
            # the broker measured is the working tree: HEAD plus this diff (sha256 of `git diff HEAD -- broker_image`)
            "txbroker_worktree_diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None}


def snapshot_txbroker() -> tuple[str, dict]:
    """Copy broker_image/txbroker to a temp dir and put it first on PYTHONPATH of every process this
    run starts (brokers, load generators, check-back client): other engineers may edit or commit the
    broker during the half hour a run takes, and a run must measure one version, recorded here."""
    d = tempfile.mkdtemp(prefix="txbroker-compare-src-")
    shutil.copytree(BENCH.parent / "broker_image" / "txbroker", Path(d) / "txbroker",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    h = hashlib.sha256()
    for f in sorted(p for p in (Path(d) / "txbroker").rglob("*") if p.is_file()):
        h.update(str(f.relative_to(d)).encode() + b"\0" + f.read_bytes())
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = d + (os.pathsep + old if old else "")
    return d, {"txbroker_source": "snapshot of broker_image/txbroker taken at the start, first on PYTHONPATH",
               "txbroker_source_sha256": h.hexdigest()}


def timing(a) -> W.Timing:
    t = W.Timing.quick() if a.quick else W.Timing(duration_s=10.0, warmup_s=5.0, report_s=5.0,
                                                    drain_s_fast_interval=60.0, consume_wait_s=20.0,
                                                    broker_warmup_s=15.0)
    if a.duration:
        t.duration_s = a.duration
    if a.warmup is not None:
        t.warmup_s = a.warmup
    return t


def retable(path: Path) -> int:
    doc = json.loads(path.read_text())
    flushes = list(dict.fromkeys(c["flush"] for c in doc["cases"] if c.get("flush")))
    doc["tables"] = compare_report.tables(doc["cases"], flushes)
    doc["tables_rendered_utc"] = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path.write_text(json.dumps(doc, indent=1, default=str))
    for flush, lines in doc["tables"].items():
        print(f"\n{flush} flush (1 KiB, 8 queues; ratio = txbroker / RocketMQ):")
        print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 s per case, 1 s warm-up")
    ap.add_argument("--flush", default="ASYNC,SYNC", help="flush modes in order (ASYNC,SYNC)")
    ap.add_argument("--only", default="1,2,3,4,5", help="workloads (1-5, as numbered in issue 8)")
    ap.add_argument("--systems", default="txbroker,rocketmq")
    ap.add_argument("--no-python-client", action="store_true", help="skip rocketmq-python-client (workload 1)")
    ap.add_argument("--no-profile", action="store_true", help="skip the py-spy profile of the txbroker broker")
    ap.add_argument("--profile-only", action="store_true", help="run only the py-spy profile (no comparison)")
    ap.add_argument("--profile-producers", default="1,8", help="producer counts to profile (1,8)")
    ap.add_argument("--duration", type=float, help="measured seconds per case (default 10, quick 3)")
    ap.add_argument("--warmup", type=float, help="unmeasured seconds before (default 5, quick 1)")
    ap.add_argument("--check-interval-ms", type=int, default=5000,
                    help="workload 2: txbroker --check-interval-ms and RocketMQ transactionCheckInterval")
    ap.add_argument("--light-rate", type=float, default=85.0,
                    help="workload 3, light: txbroker tx/s (RocketMQ: 1 thread, 10 ms pause, about 85/s)")
    ap.add_argument("--groups", type=int, default=1, help="N >= 2: workload 1 also on N broker groups each side "
                    "(txbroker cluster of N groups, RocketMQ N brokers under one name server); default 1: not run")
    ap.add_argument("--out", help="JSON path (default bench/results/compare-<UTC>.json)")
    ap.add_argument("--table-from", metavar="JSON", help="run nothing: print the tables of an earlier result file "
                    "(rendered again from its cases, and stored back into it)")
    a = ap.parse_args(argv)
    if a.table_from:
        return retable(Path(a.table_from))

    def _term(signum, _frame):  # SIGTERM/SIGHUP -> exception: every `with` block stops its processes
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGHUP, _term)

    flushes = [f.strip().upper() for f in a.flush.split(",") if f.strip()]
    only = {w.strip() for w in a.only.split(",")}
    systems = {s.strip() for s in a.systems.split(",")}
    if a.profile_only:
        flushes, systems, a.no_profile = [], {"txbroker"}, False
    t = timing(a)
    ts = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(a.out) if a.out else RESULTS_DIR / f"compare-{ts}{'-quick' if a.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if "rocketmq" in systems and flushes:
        fetch(DEFAULT_VERSION)  # fail early if the jars cannot be had
    snap, snap_info = snapshot_txbroker() if "txbroker" in systems else (None, {})
    doc = {
        "benchmark": "txbroker vs Apache RocketMQ, side by side (tracker issue 8)",
        "started_utc": ts,
        "command": shlex.join([sys.executable] + sys.argv),  # the process's exact command line
        "compare_args": list(sys.argv[1:] if argv is None else argv),
        "cwd": os.getcwd(),
        "machine": machine_info(),
        "versions": {**versions(), **snap_info},
        "loadavg_at_start": loadavg(),
        "settings": {"quick": a.quick, "flush_modes": flushes, "workloads": sorted(only), "systems": sorted(systems),
                     "timing": t.__dict__, "message_size": 1024, "queues": 8, "concurrency": [1, 8, 32],
                     "check_interval_ms": a.check_interval_ms, "transaction_timeout_ms": 6000, "check_max": 15,
                     "light_rate": a.light_rate, "python_client": not a.no_python_client,
                     "broker_groups": a.groups if a.groups > 1 else None},
        "notes": NOTES,
        "rocketmq_peers": [],
        "cases": [],
        "tables": {},
    }

    def save():
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(out)

    def add(r):
        doc["cases"].append(r)
        save()

    log = lambda s: print(s, flush=True)  # noqa: E731
    started = time.monotonic()
    print(f"compare ({'quick' if a.quick else 'full'}): {flushes}, workloads {sorted(only)}, {t.duration_s:g} s per "
          f"case after {t.warmup_s:g} s warm-up; load {doc['loadavg_at_start']}; -> {out}", flush=True)
    rc = 0
    try:
        for flush in flushes:
            if "txbroker" in systems:
                compare_txbroker.run_all(flush, t, a.light_rate, a.check_interval_ms, log=log, on_case=add, only=only)
            if "rocketmq" in systems:
                compare_rocketmq.run_all(flush, t, a.check_interval_ms, python_client=not a.no_python_client
                                         and "1" in only, log=log, on_case=add, peers=doc["rocketmq_peers"],
                                         only=only)
            if a.groups > 1 and "1" in only:
                if "txbroker" in systems:
                    compare_txbroker.run_groups(flush, t, a.groups, log=log, on_case=add)
                if "rocketmq" in systems:
                    compare_rocketmq.run_groups(flush, t, a.groups, log=log, on_case=add, peers=doc["rocketmq_peers"])
            doc["tables"][flush] = compare_report.tables(doc["cases"], [flush])[flush]
            save()
            print(f"\n== {flush} flush, after {time.monotonic() - started:.0f} s", flush=True)
            print("\n".join(doc["tables"][flush]) + "\n", flush=True)
        if not a.no_profile and "txbroker" in systems:
            doc["profile"] = compare_profile.run(out.with_name(out.stem + "-profile"), t, log=log, producers=tuple(
                int(n) for n in a.profile_producers.split(",")))
    except KeyboardInterrupt as e:
        doc["interrupted"] = str(e) or "KeyboardInterrupt"
        rc = 130
    finally:
        doc["loadavg_at_end"] = loadavg()
        doc["elapsed_s"] = round(time.monotonic() - started, 1)
        save()
        if snap:
            shutil.rmtree(snap, ignore_errors=True)
    for flush, lines in doc["tables"].items():
        print(f"\n{flush} flush (1 KiB, 8 queues; ratio = txbroker / RocketMQ):")
        print("\n".join(lines))
    failed = [c for c in doc["cases"] if c.get("error")]
    print(f"\n{len(doc['cases'])} cases, {len(failed)} failed; wrote {out} in {doc['elapsed_s']:.0f} s")
    return rc or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
