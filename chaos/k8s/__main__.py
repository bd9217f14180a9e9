"""`python -m chaos.k8s` (`make chaos-k8s SEEDS=1-20`): fault schedules against an operator-deployed
TxBroker on the testbed's one-node Kubernetes cluster, each judged by the history checker. As root.

    .venv/bin/python -m chaos.k8s --seeds 1-20 [--duration 90] [--families process,pod,network,operator]
                                  [--no-storage] [--keep-logs] [--results DIR] [--image-tag TAG]
    .venv/bin/python -m chaos.k8s --seeds 1-20 --results DIR --summarize   # summary.txt of runs made in chunks

Brings the cluster up when none is (testbed/cluster.sh up; down again at the end) and runs itself
inside its network namespace, one schedule at a time; each schedule in a namespace of its own
(chaos-k8s-<seed>-<random>: the chart's operator, the TxBroker, the workload pod), deleted after
it. Writes bench/results/chaos-k8s-<time>/seed-<n>.json and summary.txt, prints a line per
schedule and chaos/__main__.py's summary.

The cluster is shared (the e2e tests, other people's `testbed/cluster.sh up`, which restarts it):
a schedule whose cluster went away under it is not reported; the run waits for a cluster (starting
one itself if none comes back within two minutes) and runs that seed again, then the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from chaos.k8s.node import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
NETNS = os.environ.get("TXBROKER_NETNS", "txb-node")
CLUSTER_WENT_AWAY = 75  # the inner run's exit code: run again in the cluster's new namespace
MAX_RESTARTS = 20


def _inside_cluster_network() -> bool:
    try:
        return os.stat("/proc/self/ns/net").st_ino == os.stat(f"/var/run/netns/{NETNS}").st_ino
    except FileNotFoundError:
        return False


def _cluster_dir() -> Path:
    from chaos.k8s.deploy import DIR
    return DIR


def _wait_for_cluster(started: bool) -> bool:
    """A cluster up (its env file written, its namespace there); starts one when none is, or none
    comes back within two minutes. True if this process started it."""
    env, netns = _cluster_dir() / "env", Path(f"/var/run/netns/{NETNS}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (env.exists() and netns.exists()):
        time.sleep(5)  # someone's `testbed/cluster.sh up` may be under way
    if env.exists() and netns.exists():
        return started
    print(f"no cluster is up: testbed/cluster.sh up (load average {os.getloadavg()[0]:.1f})", flush=True)
    subprocess.run(["bash", str(ROOT / "testbed" / "cluster.sh"), "up"], check=True)
    return True


def _outside(argv: list[str], results: str) -> int:
    """Run this command inside the cluster's network namespace (a cluster brought up if none is),
    again after the cluster was restarted under it."""
    if os.geteuid() != 0:
        raise SystemExit("the node's fault harness needs root (the cluster, nsenter, iptables in pods' namespaces)")
    started = False
    try:
        for _ in range(MAX_RESTARTS):
            started = _wait_for_cluster(started)
            rc = subprocess.run(["nsenter", f"--net=/var/run/netns/{NETNS}", sys.executable, "-m", "chaos.k8s",
                                 *argv, "--results", results, "--resume"], cwd=ROOT).returncode
            if rc != CLUSTER_WENT_AWAY:
                return rc
            print("the cluster was restarted under the run: waiting for it, then the rest of the seeds", flush=True)
            time.sleep(10)
        return 1
    finally:
        if started:
            subprocess.run(["bash", str(ROOT / "testbed" / "cluster.sh"), "down"], check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1-3", help="e.g. 1-20 or 4,9,12")
    ap.add_argument("--duration", type=float, default=90.0, help="seconds of faults and load per schedule")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help=f"the nemesis families (default all: {', '.join(FAMILIES)})")
    ap.add_argument("--no-storage", action="store_true",
                    help="brokers on emptyDir instead of a PVC each (a force-deleted pod comes back empty)")
    ap.add_argument("--checks-as-workload", action="store_true",
                    help="the workload pod answers check-backs exactly as chaos/workload.py does, also for a "
                         "transaction whose local transaction never ran (chaos/k8s/pod.py, CheckBacks)")
    ap.add_argument("--image-tag", default=None, help="the images' tag (default: the project's version)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the pods' logs of every schedule, not only failing ones")
    ap.add_argument("--keep-namespace", action="store_true", help="leave each schedule's namespace running")
    ap.add_argument("--results", default=None, help="directory for the reports (default bench/results/chaos-k8s-<time>)")
    ap.add_argument("--resume", action="store_true", help="skip the seeds that already have a report in --results")
    ap.add_argument("--stop-at-anomaly", action="store_true",
                    help="end the run after a schedule with an anomaly (the rest of the seeds not run)")
    ap.add_argument("--summarize", action="store_true",
                    help="run nothing: write --results' summary.txt from its reports of --seeds (runs in chunks)")
    args = ap.parse_args()
    results = Path(args.results or ROOT / "bench" / "results" / f"chaos-k8s-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.summarize:
        from chaos.__main__ import parse_seeds
        return write_summary(results, parse_seeds(args.seeds), args.duration)
    if not _inside_cluster_network():
        argv = [a for a in sys.argv[1:] if a != "--resume"]
        if args.results:
            i = argv.index("--results") if "--results" in argv else None
            argv = argv[:i] + argv[i + 2:] if i is not None else [a for a in argv if not a.startswith("--results=")]
        return _outside(argv, str(results))

    from chaos.__main__ import parse_seeds
    from chaos.k8s import schedule
    from chaos.k8s.deploy import Api, Cluster

    tb = Cluster()
    tb.check_reachable()
    api = Api(tb)
    results.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"results in {results} (code {commit})", flush=True)
    families = args.families.split(",")
    for seed in parse_seeds(args.seeds):
        report = results / f"seed-{seed}.json"
        if args.resume and report.exists():
            continue
        print(f"seed {seed}: starting (load average {os.getloadavg()[0]:.1f})", flush=True)
        r = schedule.run(tb, api, seed, args.duration, results, families=families, storage=not args.no_storage,
                         tag=args.image_tag, keep_logs=args.keep_logs, keep_namespace=args.keep_namespace,
                         checks_as_workload=args.checks_as_workload, log=lambda m: print(m, flush=True))
        if not _inside_cluster_network():
            print(f"seed {seed}: the cluster went away under it (restarted by someone); not reported", flush=True)
            return CLUSTER_WENT_AWAY
        r["code"] = commit
        report.write_text(json.dumps(r, indent=2))
        print(seed_line(r) + ("" if "error" not in r else f" (see {results})"), flush=True)
        if args.stop_at_anomaly and r.get("anomalies"):
            print(f"seed {seed}: anomalies; the rest of the seeds not run (--stop-at-anomaly)", flush=True)
            break
    return write_summary(results, parse_seeds(args.seeds), args.duration)


def seed_line(r: dict) -> str:
    """One schedule in a line: its faults by family, failovers, commits, anomalies, time."""
    t = r.get("timings", {}).get("total_s", 0)
    if "error" in r:
        return f"seed {r['seed']}: ERROR ({t:.0f}s, load {r.get('load_average')})"
    families = ", ".join(f"{k} {v}" for k, v in sorted(r["faults_by_family"].items()))
    return (f"seed {r['seed']}: {sum(r['faults'].values())} faults ({families}; skipped {len(r['faults_skipped'])}), "
            f"failovers {r['failovers']}, Lease handovers {r['operator']['lease_transitions']}, "
            f"{r['commits_acknowledged']} commits acknowledged, {r['failed_operations']} failed operations, "
            f"anomalies {r['anomalies'] or 'none'} ({t:.0f}s, load max {r['load_average'].get('max_1min')})")


def write_summary(results: Path, seeds: list[int], duration: float) -> int:
    """summary.txt in `results` from the reports there of `seeds`: a line per schedule, then the
    summary; 1 if any had an anomaly or an error."""
    from chaos.__main__ import summary
    reports = [json.loads((results / f"seed-{s}.json").read_text()) for s in seeds
               if (results / f"seed-{s}.json").exists()]
    if not reports:
        print(f"no reports of seeds {seeds[0]}-{seeds[-1]} in {results}")
        return 1
    code = sorted({r.get("code", "") for r in reports})
    text = "\n".join([f"code: {', '.join(code)}", *(seed_line(r) for r in reports), "",
                       summary(reports), node_summary(reports, duration)])
    (results / "summary.txt").write_text(text + "\n")
    print(text)
    return 1 if any(r.get("anomalies") or "error" in r for r in reports) else 0


def node_summary(reports: list[dict], duration: float) -> str:
    """What the node adds to chaos/__main__.py's summary: time, load, failovers by the fault behind
    them, the operator's handovers, faults that found no target, check-backs of transactions never run."""
    ok = [r for r in reports if "error" not in r]
    if not ok:
        return ""
    times = sorted(r["timings"]["total_s"] for r in ok)
    lines = [f"time per schedule: median {times[len(times) // 2]:.0f} s, max {times[-1]:.0f} s ({duration:.0f} s of "
             f"faults each); machine load average (1 min) max {max(r['load_average'].get('max_1min', 0) for r in ok):.1f} "
             f"on {os.cpu_count()} cores",
             f"failovers: {sum(r['failovers'] for r in ok)}; operator Lease handovers: "
             f"{sum(r['operator']['lease_transitions'] for r in ok)}; container restarts of brokers: "
             f"{sum(sum(r['restarts'].values()) for r in ok)}"]
    by_kind: dict[str, list[float]] = {}
    for r in ok:
        for f in r.get("promoted_after_fault", []):
            by_kind.setdefault(f["kind"], []).append(f["promoted_after_s"])
    if by_kind:
        lines.append("promotions by the fault behind them (s from the fault to the new master first seen serving: "
                     "n, median / max):")
        for kind, ts in sorted(by_kind.items()):
            ts.sort()
            lines.append(f"  {kind:28} {len(ts):3d}   {ts[len(ts) // 2]:6.2f} / {ts[-1]:6.2f}")
    mid = [e for r in ok for e in r["events"] if e["kind"] == "kill-operator-mid-failover" and "skipped" not in e]
    if mid:
        done = sorted(e["failover_finished_after_s"] for e in mid if e.get("failover_finished_after_s") is not None)
        lines.append(f"operator leader killed mid-failover: {len(mid)}, the standby finished {len(done)}"
                     + (f" (median {done[len(done) // 2]:.1f} s, max {done[-1]:.1f} s after the master's kill)"
                        if done else ""))
    skipped = [(r["seed"], f["kind"]) for r in ok for f in r.get("faults_skipped", [])]
    lines.append(f"faults that found no target (skipped): {len(skipped)}" + (f" {skipped[:10]}" if skipped else ""))
    never = sum(r["check_backs"]["never_ran_count"] for r in ok)
    lines.append(f"check-backs of transactions whose local transaction never ran (answered ROLLBACK unless "
                 f"--checks-as-workload): {never}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
