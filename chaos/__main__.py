"""`python -m chaos` (`make chaos SEEDS=1-100`): randomized fault schedules against a real cluster,
each judged by the history checker. As root (network namespaces, packet filters, mounts).

    .venv/bin/python -m chaos --seeds 1-20 [--families process,power] [--duration 60] [--results DIR]

Per seed: a hub namespace and one per broker (net.py), two broker groups of three brokers (1
master, 2 slaves, SYNC replication and flush) with a route file and a short retention, a controller
process per group running the operator's failover (controller.py), the workload (workload.py, read
back by reader.py) and a nemesis from the seed (nemesis.py, schedule.py), then the check
(checker.py). Prints a line per schedule and a summary: faults by family and kind, operations,
anomalies by kind (the seeds that had any), and per fault kind the longest time without an
acknowledged commit and the failed operations.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from chaos.broker import MODES
from chaos.nemesis import FAMILIES
from chaos.net import Network, in_ns
from chaos.schedule import MAX_BROKERS

ROOT = Path(__file__).resolve().parents[1]


def parse_seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _unmount_under(work: str) -> None:
    """The brokers' tmpfs data directories, if the schedule died before unmounting them."""
    for line in Path("/proc/mounts").read_text().splitlines():
        point = line.split()[1]
        if point.startswith(work + "/"):
            subprocess.run(["umount", "-l", point], check=False)


def run_one(seed: int, duration: float, results: Path, mode: str = "SYNC", keep_logs: bool = False,
            families: str = ",".join(FAMILIES), retention: float = 20.0, every_kind: bool = False) -> dict:
    tag = f"{seed % 10000}"
    net = Network(tag, MAX_BROKERS).up()
    report = results / f"seed-{seed}.json"
    try:
        with tempfile.TemporaryDirectory(prefix=f"txbroker-chaos-{seed}-") as work:
            try:
                r = subprocess.run(in_ns(net.hub, sys.executable, "-m", "chaos.schedule", "--seed", str(seed),
                                         "--duration", str(duration), "--workdir", work, "--tag", tag,
                                         "--report", str(report), "--mode", mode, "--families", families,
                                         "--retention", str(retention), *(["--every-kind"] if every_kind else [])),
                                   cwd=ROOT, capture_output=True, text=True, timeout=duration + 420)
            finally:
                _unmount_under(work)
            failed = r.returncode != 0 or (report.exists() and json.loads(report.read_text()).get("anomalies"))
            if failed or keep_logs:  # keep the brokers' logs beside the report, for the operations around it
                for log in Path(work).glob("*.log"):  # brokers, proxies, controllers
                    shutil.copy(log, results / f"seed-{seed}-{log.name}")
                (results / f"seed-{seed}-harness.log").write_text(r.stdout + r.stderr)
                history = Path(work, "history.json.gz")
                if history.exists():
                    shutil.copy(history, results / f"seed-{seed}-history.json.gz")
            if failed and any(Path(work, d).is_dir() for d in ("backups", "restored")):
                # the backups taken and their restored stores, for a restored copy the checker faulted
                subprocess.run(["tar", "czf", str(results / f"seed-{seed}-backups.tar.gz"), "-C", work,
                                *[d for d in ("backups", "restored") if Path(work, d).is_dir()]], check=False)
            if r.returncode != 0:
                return {"seed": seed, "error": (r.stdout + r.stderr)[-3000:]}
    finally:
        net.down()
    return json.loads(report.read_text())


def code_identity() -> dict:
    """The commit the harness and brokers run from, and whether their files differ from it: a
    report says which code it judged."""
    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
        return r.stdout.strip()
    return {"commit": git("rev-parse", "--short=7", "HEAD") or "unknown",
            "modified": bool(git("status", "--porcelain", "--", "broker_image", "operator", "chaos"))}


def reports_in(results: Path) -> list[dict]:
    """Every schedule's report in `results` (seed-N.json; a seed's earlier runs are kept as
    seed-N-<why>.json and left out), by seed."""
    found = [json.loads(p.read_text()) for p in results.glob("seed-*.json")
             if re.fullmatch(r"seed-\d+\.json", p.name)]
    return sorted(found, key=lambda r: r["seed"])


def code_label(report: dict) -> str:
    """The commit a schedule ran on: a local report records {commit, modified}, a node's the commit."""
    code = report.get("code")
    if code is None:
        return "unrecorded"
    if isinstance(code, str):
        return code
    return code["commit"] + (" (modified)" if code["modified"] else "")


def summary(reports: list[dict]) -> str:
    ok = [r for r in reports if "error" not in r]
    faults, anomalies, ops, group, families = Counter(), Counter(), Counter(), Counter(), Counter()
    lost_async = [(r["seed"], r["lost_under_async"]) for r in ok if r.get("mode", "SYNC") != "SYNC"]
    after_loss = Counter()
    for r in ok:
        after_loss.update(r.get("group_after_async_loss", {}))
    bad_seeds = defaultdict(list)
    gaps, failed = defaultdict(list), defaultdict(list)
    for r in ok:
        faults.update(r["faults"])
        families.update({f: 1 for f in r.get("faults_by_family", {})})
        ops.update(r["operations"])
        group.update(r.get("group", {}))
        for kind, n in r["anomalies"].items():
            anomalies[kind] += n
            bad_seeds[kind].append(r["seed"])
        for ev in r["liveness"]:
            gaps[ev["kind"]].append(ev["longest_without_commit_s"])
            failed[ev["kind"]].append(ev["failed_ops"])
    lines = [f"{len(reports)} schedules ({len(reports) - len(ok)} errors), seeds "
             f"{min(r['seed'] for r in reports)}-{max(r['seed'] for r in reports)}",
             "schedules with a fault of each family: " + ", ".join(f"{k} {v}" for k, v in sorted(families.items())),
             "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())),
             "operations: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())),
             "consumer group: " + ", ".join(f"{k} {v}" for k, v in sorted(group.items())),
             "anomalies: " + (", ".join(f"{k} {v} (seeds {bad_seeds[k][:10]})" for k, v in anomalies.items())
                              or "none"),
             *([f"ASYNC: acknowledged commits lost {sum(n for _, n in lost_async)} in {len(lost_async)} schedules "
                f"(per seed: {dict((s, n) for s, n in lost_async if n)}); the group, after those losses: "
                + (", ".join(f"{k} {v}" for k, v in sorted(after_loss.items())) or "nothing")] if lost_async else [])]
    windows: dict[str, list] = defaultdict(list)
    for r in ok:
        for cause, w in r.get("loss_window", {}).items():
            if cause != "unplaced":
                windows[cause].append((w["max_ms"], w["lost"], r["seed"]))
    for cause, w in sorted(windows.items()):
        worst = max(w)
        lines.append(f"loss window, {cause}: {sum(n for _, n, _ in w)} lost commits acknowledged at most "
                     f"{worst[0]:.0f} ms before it (seed {worst[2]}), in {len(w)} schedules")
    codes = Counter(code_label(r) for r in ok)
    lines.append("code: " + ", ".join(f"{c} ({n} schedules)" for c, n in sorted(codes.items())))
    moved = sum(r.get("reordered_where_the_key_moved", 0) for r in ok)
    unplaced = sum(r.get("reordered_after_route_change", 0) for r in ok)
    lines.append(f"ordered keys reordered across a move to another queue (a route change; not anomalies): {moved} keys"
                 f" in {sum(1 for r in ok if r.get('reordered_where_the_key_moved'))} schedules; where a send's queue"
                 f" is unknown (unanswered) and the route changed: {unplaced} keys")
    skipped = [(r["seed"], x["kind"]) for r in ok for x in r.get("skipped_steps", [])]
    lines.append(f"faults skipped (the cluster's state forbade them for 20 s): {len(skipped)}"
                 + (f" {skipped[:10]}" if skipped else ""))
    cuts = [sum(r.get("truncations", {}).values()) for r in ok]
    lines.append(f"logs truncated on rejoining a new master: {sum(cuts)} times in {sum(1 for n in cuts if n)} schedules")
    damage = Counter()
    for r in ok:
        damage.update(r.get("corruption", {}))
    if damage["damaged"]:
        lines.append(f"corruption: {damage['damaged']} damaging faults on {damage['brokers']} brokers; the brokers' logs: "
                     f"found while running {damage['found while running']}, seeds begun for a damaged store "
                     f"{damage['seeds for damage']}, seeds finished (for damage, or for records the master deleted) {damage['seeded']}")
    backups = Counter()
    for r in ok:
        backups.update(r.get("backup_outcomes", {}))
        backups["restored and checked"] += r.get("backups_restored_and_checked", 0)
    if any(backups.values()):
        lines.append("backups: " + ", ".join(f"{k} {v}" for k, v in sorted(backups.items())))
    promoted = [f["first_commit_after_s"] for r in ok for f in r.get("after_promotion", [])]
    got = sorted(t for t in promoted if t is not None)
    if got:
        lines.append(f"first acknowledged commit after a promotion: {len(got)} of {len(promoted)} failovers, "
                     f"median {statistics.median(got):.3f} s, max {got[-1]:.3f} s")
    lines.append("liveness per fault (longest time without an acknowledged commit, s: median / max; failed client "
                 "operations: median / max):")
    for kind in sorted(gaps):
        lines.append(f"  {kind:28} {statistics.median(gaps[kind]):6.2f} / {max(gaps[kind]):6.2f}   "
                     f"{statistics.median(failed[kind]):5.0f} / {max(failed[kind]):5d}")
    for r in reports:
        if "error" in r:
            lines.append(f"seed {r['seed']}: ERROR {r['error'][-500:]}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1-3", help="e.g. 1-100 or 4,9,12")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of faults and load per schedule")
    ap.add_argument("--mode", choices=MODES, default="SYNC",
                    help="SYNC: replication and flush; ASYNC: both (lost commits are counted, not anomalies); "
                         "ASYNC_FLUSH: SYNC replication, ASYNC flush (commits lost to a whole group's power cut "
                         "are counted, any other loss is an anomaly)")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help=f"the nemesis families to draw faults from (default all: {', '.join(FAMILIES)})")
    ap.add_argument("--retention", type=float, default=20.0,
                    help="the brokers' retention in seconds (0: none); decided jobs expire after twice that")
    ap.add_argument("--every-kind", action="store_true",
                    help="draw every fault of the families first, not one of each family (make test's fixed seeds)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the brokers' logs of every schedule, not only failing ones")
    ap.add_argument("--results", default=None, help="directory for the reports (default bench/results/chaos-<time>); "
                    "its summary.txt covers every report there, from earlier runs into it too")
    ap.add_argument("--summarize", metavar="DIR",
                    help="only write DIR/summary.txt from the reports in DIR, and print it")
    args = ap.parse_args()
    if args.summarize:
        text = summary(reports_in(Path(args.summarize)))
        (Path(args.summarize) / "summary.txt").write_text(text + "\n")
        print(text)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: each schedule still tears down
    results = Path(args.results or ROOT / "bench" / "results" / f"chaos-{time.strftime('%Y%m%d-%H%M%S')}")
    results.mkdir(parents=True, exist_ok=True)
    reports = []
    code = code_identity()
    for seed in parse_seeds(args.seeds):
        t0 = time.monotonic()
        r = run_one(seed, args.duration, results, args.mode, args.keep_logs, args.families, args.retention,
                    args.every_kind)
        reports.append(r)
        if "error" in r:
            print(f"seed {seed}: ERROR (see {results})", flush=True)
            continue
        r["code"] = code
        (results / f"seed-{seed}.json").write_text(json.dumps(r, indent=2))
        print(f"seed {seed}: {sum(r['faults'].values())} faults ({dict(r['faults'])}), {r['failovers']} failovers, "
              f"{r['commits_acknowledged']} commits acknowledged, {r['failed_operations']} failed operations, "
              f"anomalies {r['anomalies'] or 'none'} ({time.monotonic() - t0:.0f}s)", flush=True)
    text = summary(reports_in(results) + [r for r in reports if "error" in r])
    (results / "summary.txt").write_text(text + "\n")
    print(text)
    return 1 if any(r.get("anomalies") or "error" in r for r in reports) else 0


if __name__ == "__main__":
    raise SystemExit(main())
