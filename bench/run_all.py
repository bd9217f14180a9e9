"""Entry of `make bench`: the txbroker broker benchmarks, then txbroker beside Apache RocketMQ.

    .venv/bin/python bench/run_all.py                   # everything (about 45 min)
    .venv/bin/python bench/run_all.py --quick           # a smoke run of everything (about 20 min)
    .venv/bin/python bench/run_all.py --skip-broker --skip-cluster   # only the side-by-side comparison
    .venv/bin/python bench/run_all.py --compare-args "--flush ASYNC --only 1,2"   # options for compare.py
    .venv/bin/python bench/run_all.py --with-rocketmq   # also bench/rocketmq/run.py (the peer's full suite)
    .venv/bin/python bench/run_all.py --only tx,check   # any other option goes to bench/broker/suite.py

In order: bench/broker/suite.py (unless --skip-broker); bench/replication_bench.py (ASYNC and SYNC
replication, failover time) and bench/consumer_bench.py (consume throughput, commit-to-delivery for
a push consumer), unless --skip-cluster; bench/compare.py (the issue-8 workloads against txbroker and
RocketMQ 5.3.3 one after the other, table per flush mode, py-spy profile of the broker), unless
--skip-compare; bench/rocketmq/run.py with --with-rocketmq.

The benchmarks print figures and write JSON under bench/results/; they never pass or fail on timing.
The two suites run one after the other, never at once (they would compete for the 2 cores).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROCKETMQ_RUN = HERE / "rocketmq" / "run.py"
COMPARE = HERE / "compare.py"


def _rocketmq_accepts(flag: str) -> bool:
    try:
        out = subprocess.run([sys.executable, str(ROCKETMQ_RUN), "--help"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return flag in out.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 add_help=False)
    ap.add_argument("-h", "--help", action="store_true")
    ap.add_argument("--with-rocketmq", action="store_true",
                    help="after the txbroker benchmarks, run bench/rocketmq/run.py (the Apache RocketMQ peer)")
    ap.add_argument("--rocketmq-args", default="", help="extra arguments for bench/rocketmq/run.py (one string)")
    ap.add_argument("--skip-broker", action="store_true", help="do not run the txbroker broker benchmarks")
    ap.add_argument("--skip-cluster", action="store_true",
                    help="do not run the replication and consumer benchmarks")
    ap.add_argument("--skip-compare", action="store_true",
                    help="do not run bench/compare.py (txbroker beside Apache RocketMQ)")
    ap.add_argument("--compare-args", default="", help="extra arguments for bench/compare.py (one string)")
    args, rest = ap.parse_known_args(argv)
    if args.help:
        ap.print_help()
        print("\noptions of the txbroker broker benchmarks (bench/broker/suite.py):\n")
        subprocess.run([sys.executable, str(HERE / "broker" / "suite.py"), "--help"])
        if not ROCKETMQ_RUN.exists():
            print(f"\n--with-rocketmq needs {ROCKETMQ_RUN.relative_to(HERE.parent)}, which is not there yet.")
        return 0
    if args.with_rocketmq and not ROCKETMQ_RUN.exists():
        print(f"--with-rocketmq: {ROCKETMQ_RUN} does not exist", file=sys.stderr)
        return 2
    rc = 0
    if not args.skip_broker:
        sys.path.insert(0, str(HERE / "broker"))
        import suite  # bench/broker/suite.py

        rc = suite.main(rest)
    if not args.skip_cluster:
        for script in ("replication_bench.py", "consumer_bench.py"):
            cmd = [sys.executable, str(HERE / script)] + (["--quick"] if "--quick" in rest else [])
            rc = subprocess.run(cmd).returncode or rc
    if not args.skip_compare:
        cmd = [sys.executable, str(COMPARE)] + (["--quick"] if "--quick" in rest else []) + args.compare_args.split()
        print(f"\n== txbroker beside Apache RocketMQ: {' '.join(cmd)}", flush=True)
        rc = subprocess.run(cmd).returncode or rc
    if args.with_rocketmq:
        cmd = [sys.executable, str(ROCKETMQ_RUN)]
        if "--quick" in rest and _rocketmq_accepts("--quick"):
            cmd.append("--quick")
        cmd += args.rocketmq_args.split()
        print(f"\n== Apache RocketMQ peer: {' '.join(cmd)}", flush=True)
        rc = subprocess.run(cmd).returncode or rc
    return rc


if __name__ == "__main__":
    sys.exit(main())
