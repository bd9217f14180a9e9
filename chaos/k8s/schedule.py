"""One schedule on the node: deploy (deploy.py), load (the workload pod), faults from the seed
(node.py), heal, settle, let the consumers finish, read everything, check (chaos/checker.py, the
same checks as the local harness, over the whole history), one JSON report.

The schedule is drawn from the seed before the first fault (chaos/steps.py): one fault of every
family the schedule runs, in an order from the seed, then faults of any of them while they fit in
the time; each is held 2-8 s (a mid-failover operator kill: until the standby has finished the
failover) and healed, 1-3 s apart, its targets drawn from a random source of its own. Runs inside the cluster's
network namespace (`python -m chaos.k8s` enters it).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from chaos import checker, steps
from chaos.k8s import record
from chaos.k8s.deploy import Deployment, check_cluster, wait
from chaos.k8s.node import FAMILIES, Nemesis
from chaos.k8s.watch import Watcher, settle

SETTLE_S = 180  # every group's master with nothing pending, parked or undecided, its log published
CONSUME_S = 240  # then the consumer groups finish (a refused message comes back after 10 s, then 30 s)


def plan(rnd: random.Random, families: list[str]) -> list[str]:
    order = list(families)
    rnd.shuffle(order)
    return [rnd.choice(FAMILIES[f]) for f in order]


def _liveness(events: list[dict], commits: list[float], failures: list[float], end: float) -> list[dict]:
    """Per fault (times on the runner's monotonic clock): the longest stretch without an
    acknowledged commit from its start to the next fault's, and the client operations that failed."""
    out = []
    commits = sorted(commits)
    for i, ev in enumerate(events):
        until = events[i + 1]["start"] if i + 1 < len(events) else end
        window = [ev["start"]] + [t for t in commits if ev["start"] <= t <= until] + [until]
        gap = max(b - a for a, b in zip(window, window[1:]))
        out.append({"kind": ev["kind"], "target": ev["target"], "held_s": round(ev.get("healed", until) - ev["start"], 2),
                    "longest_without_commit_s": round(gap, 2),
                    "failed_ops": sum(1 for t in failures if ev["start"] <= t <= until)})
    return out


def _after_promotions(promotions: dict[str, dict], commits: list[float]) -> list[dict]:
    """Per promotion (a group's epoch above 1 first seen served by its master): how long until the
    first acknowledged commit, on any group."""
    commits = sorted(commits)
    out = []
    for key, p in sorted(promotions.items()):
        group, epoch = key.split("@")
        if int(epoch) <= 1:
            continue
        first = next((t for t in commits if t >= p["mono"]), None)
        out.append({"group": group, "to": p["by"], "epoch": int(epoch),
                    "first_commit_after_s": None if first is None else round(first - p["mono"], 3)})
    return out


def _failovers_after(events: list[dict], promotions: dict[str, dict], end: float) -> list[dict]:
    """Per fault, the promotions in its group first seen served between its start and the next
    fault's: how long after the fault (the operator's grace, its pass, the promotion, one look)."""
    out = []
    for i, ev in enumerate(events):
        until = events[i + 1]["start"] if i + 1 < len(events) else end
        for key, p in sorted(promotions.items()):
            group, epoch = key.split("@")
            if group == ev["group"] and int(epoch) > 1 and ev["start"] <= p["mono"] < until:
                out.append({"kind": ev["kind"], "group": group, "epoch": int(epoch), "to": p["by"],
                            "promoted_after_s": round(p["mono"] - ev["start"], 2)})
    return out


def _wait_workload(d: Deployment, what: str, timeout: float, probe) -> dict:
    return wait(what, timeout, lambda: (s := d.workload("/status")) and probe(s) and s, interval=1.0)


def run(tb: Any, api: Any, seed: int, duration: float, results: Path, *, families: list[str],
        storage: bool = True, tag: str | None = None, keep_logs: bool = False, keep_namespace: bool = False,
        checks_as_workload: bool = False, log=print) -> dict:
    rnd = random.Random(seed)
    kw = {"tag": tag} if tag else {}
    d = Deployment(tb, api, seed, storage, checks_as_workload=checks_as_workload, **kw)
    work = Path(tempfile.mkdtemp(prefix=f"txbroker-chaos-k8s-{seed}-"))
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    loads = {"before": os.getloadavg()[0]}
    watcher = None
    report: dict[str, Any] = {"seed": seed, "namespace": d.namespace}
    try:
        d.up()
        timings["deploy_s"] = round(time.monotonic() - t0, 1)
        log(f"seed {seed}: deployed in {timings['deploy_s']}s (namespace {d.namespace}, load {os.getloadavg()[0]:.1f})")
        watcher = Watcher(d, tb.dir / "pod-logs", work).start()
        _wait_workload(d, "the workload's first acknowledged commit", 180, lambda s: s["commits"] > 0)
        report.update(_schedule(rnd, d, watcher, seed, duration, families, timings, loads, log))
    except Exception:  # noqa: BLE001 - one schedule's failure is reported, the next runs
        report["error"] = traceback.format_exc()[-4000:]
        log(f"seed {seed}: ERROR {report['error'][-600:]}")
    finally:
        if watcher is not None:
            watcher.stop()
        else:  # the deployment failed: its pods' logs, for the report
            Watcher(d, tb.dir / "pod-logs", work).copy_logs()
        loads["after"] = os.getloadavg()[0]
        if watcher is not None:
            loads["max_1min"] = round(max(watcher.loads or [0]), 2)
        report["load_average"] = loads
        report["timings"] = {**timings, "total_s": round(time.monotonic() - t0, 1)}
        failed = "error" in report or report.get("anomalies")
        if failed or keep_logs:
            d.collect_state(results, f"seed-{seed}")
            logs = results / f"seed-{seed}-logs"
            logs.mkdir(exist_ok=True)
            for f in work.glob("*.log"):
                shutil.move(str(f), logs / f.name)
            if (work / "history.json.gz").exists():
                shutil.move(str(work / "history.json.gz"), results / f"seed-{seed}-history.json.gz")
        shutil.rmtree(work, ignore_errors=True)
        if not keep_namespace:
            d.down()
    return report


def _schedule(rnd: random.Random, d: Deployment, watcher: Watcher, seed: int, duration: float, families: list[str],
              timings: dict, loads: dict, log) -> dict:
    nemesis = Nemesis(rnd, d)
    t_start = time.monotonic()
    t_end = t_start + duration
    time.sleep(2.0)
    # held past the 3 s failover grace more often than not
    schedule = steps.draw(rnd, plan(rnd, families), [k for f in families for k in FAMILIES[f]], duration,
                          hold_s=(2.0, 8.0), gap_s=(1.0, 3.0))
    for i, step in enumerate(schedule):
        check_cluster()
        nemesis.rnd = steps.for_step(seed, i)
        ev = nemesis.inject(step.kind)
        log(f"seed {seed}: +{ev['start'] - t_start:5.1f}s {step.kind} {ev['group']} {ev['target']}"
            + (f" (skipped: {ev['skipped']})" if "skipped" in ev else ""))
        nemesis.hold(ev, step.hold_s)
        nemesis.heal(ev)
        time.sleep(step.gap_s)
    nemesis.heal_all()
    time.sleep(max(t_end - time.monotonic(), 0))
    d.workload("/stop", post=True)
    end = time.monotonic()
    timings["faults_s"] = round(end - t_start, 1)
    loads["end_of_faults"] = os.getloadavg()[0]
    unresolved, took = settle(d, 180)
    timings["settle_s"] = round(took, 1)
    d.workload("/done", post=True)
    t = time.monotonic()
    try:
        _wait_workload(d, "the consumer groups to take everything", 240, lambda s: s.get("consumed_everything"))
    except TimeoutError:
        pass  # what they did not take is the checker's to report (group lost, dead letter, ordered lost)
    timings["consume_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    d.workload("/finish", post=True)
    _wait_workload(d, "the workload to finish (consumers stopped, every group read to its end)", 300,
                   lambda s: s["phase"] == "finished")
    raw = d.workload("/history", timeout=120)
    timings["final_read_s"] = round(time.monotonic() - t, 1)
    h, reader = record.load(raw)
    # the pod's monotonic times on the runner's clock, through the wall clock both share
    shift = raw["mono_to_wall"] - (time.time() - time.monotonic())
    commits = [c + shift for c in h.commits]
    failures = [f + shift for f in h.failures]

    anomalies = checker.check(h, reader, unresolved, watcher.masters_by_epoch())
    anomalies.update(checker.check_groups(h, reader, False))
    anomalies.pop("reordered after a route change", None)  # the route never changes here
    unverified = anomalies.pop("unverified", [])
    skipped = anomalies.pop("skipped by retention", [])
    if not raw.get("read_whole"):
        anomalies.setdefault("harness", []).append("the reader could not read every group to its end")
    if not raw.get("load_joined"):
        anomalies.setdefault("harness", []).append("the workload's clients did not stop within 60 s")
    if anomalies:
        with gzip.open(watcher.copy_to / "history.json.gz", "wt") as f:
            json.dump(raw, f)
    events = nemesis.events
    status = d.status()
    pods = d.broker_pods()
    lease = next((x for x in d.api.leases(d.namespace) if x["metadata"]["name"] == d.lease), {})
    reasons = Counter()
    for e in d.api.events(d.namespace):
        if e.get("involvedObject", {}).get("kind") in ("TxBroker", "Lease"):
            reasons[e.get("reason", "")] += e.get("count") or 1
    return {
        "mode": "SYNC", "families": families, "duration_s": duration,
        "faults": Counter(e["kind"] for e in events if "skipped" not in e),
        "faults_by_family": Counter(e["family"] for e in events if "skipped" not in e),
        "faults_skipped": [{"kind": e["kind"], "target": e["target"], "why": e["skipped"]} for e in events if "skipped" in e],
        "schedule": steps.as_report(schedule),
        "events": [{k: v for k, v in e.items() if k not in ("start", "healed", "netns")} for e in events],
        "failovers": sum(max(g.get("epoch", 1) - 1, 0) for g in status.get("groups") or []),
        "after_promotion": _after_promotions(watcher.promotions, commits),
        "promoted_after_fault": _failovers_after(events, watcher.promotions, time.monotonic()),
        "masters_at_end": {g["name"]: [g.get("master"), g.get("epoch")] for g in status.get("groups") or []},
        "operator": {"lease_transitions": (lease.get("spec") or {}).get("leaseTransitions", 0),
                     "holder_at_end": (lease.get("spec") or {}).get("holderIdentity", "")},
        "txbroker_events": dict(reasons),
        "restarts": {p["metadata"]["name"]: sum(s.get("restartCount", 0) for s in p["status"].get("containerStatuses") or [])
                     for p in pods},
        "watcher": {"looks": watcher.looks, "errors": watcher.errors, "promotions_seen": len(watcher.promotions)},
        "operations": checker.counts(h), "commits_acknowledged": len(h.commits),
        # the coverage of `properties lost`, as chaos/schedule.py reports it
        "members_read_with_their_job": sum(1 for jobs in reader.member_jobs.values() if None not in jobs),
        "failed_operations": len(h.failures), "unresolved_after_settling": unresolved,
        "anomalies": {k: len(v) for k, v in anomalies.items()},
        "anomaly_details": {k: v[:20] for k, v in anomalies.items()},
        "lost_under_async": 0, "group_after_async_loss": {},
        "unverified": len(unverified), "unverified_details": unverified[:20],
        "skipped_by_retention": len(skipped), "skipped_details": skipped[:20],
        "group": checker.group_counts(h, reader),
        # the workload pod's check-back adapter (pod.py, CheckBacks): transactions checked back whose
        # local transaction never ran (their send raised), and what was answered
        "check_backs": {"local_transactions_run": raw["check_backs"]["ran"],
                        "checked": len(raw["check_backs"]["answers"]),
                        "as_workload": raw["check_backs"]["as_workload"],
                        "never_ran": dict(list(raw["check_backs"]["never_ran_answered"].items())[:50]),
                        "never_ran_count": len(raw["check_backs"]["never_ran_answered"])},
        "liveness": _liveness(events, commits, failures, end),
    }
