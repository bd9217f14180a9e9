"""One schedule: a cluster, the workload, a seeded nemesis, healing, settling, the check.

Run inside the hub namespace by `python -m chaos` (see __main__.py); prints and writes one JSON
report: the seed, the faults injected, the operations, the anomalies by kind, and per fault the
longest time without an acknowledged commit and the client operations that failed meanwhile.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

from txbroker.client import PullConsumer
from txbroker.client.admin import AdminClient

from chaos import checker, workload
from chaos.cluster import BrokerProc, Controller, start_cluster
from chaos.net import HUB_IP, Network

log = logging.getLogger("chaos")
# The first seven are the kinds the harness began with: `--kinds 7` replays the schedules its first
# runs drew from a seed (the regression tests' seeds 7 and 19 among them).
KINDS = ("kill-master", "kill-slave", "pause-master", "pause-slave", "partition-master", "partition-slave",
         "isolate-master-from-clients", "skew-master-clock", "skew-slave-clock", "fill-master-disk",
         "fill-slave-disk")


class Nemesis:
    def __init__(self, rnd: random.Random, net: Network, procs: list[BrokerProc], ctl: Controller):
        self.rnd, self.net, self.procs, self.ctl = rnd, net, procs, ctl
        self.events: list[dict] = []

    def _pick(self, master: bool) -> BrokerProc:
        if master:
            return self.ctl.procs[self.ctl.master]
        return self.rnd.choice([p for p in self.procs if p.name != self.ctl.master])

    def inject(self, kind: str) -> dict:
        target = self._pick("-master" in kind)
        ev = {"kind": kind, "target": target.name, "start": time.monotonic()}
        if kind.startswith("kill"):
            # the controller restarts it, as the kubelet would: at once, or after a back-off longer
            # than the failover grace period (then the master fails over first)
            ev["restart_after_s"] = round(self.rnd.choice([0.0, self.rnd.uniform(3.0, 6.0)]), 2)
            target.down_until = time.monotonic() + ev["restart_after_s"]
            target.signal(signal.SIGKILL)
        elif kind.startswith("pause"):
            target.signal(signal.SIGSTOP)
        elif kind == "partition-master":
            for p in self.procs:
                if p is not target:
                    self.net.cut(target.index, p.ip, "both")
        elif kind == "partition-slave":
            ev["direction"] = self.rnd.choice(["in", "out", "both"])
            self.net.cut(target.index, self.ctl.procs[self.ctl.master].ip, ev["direction"])
        elif kind == "isolate-master-from-clients":
            self.net.cut(target.index, HUB_IP, "both")
        elif kind.startswith("skew"):  # a few seconds either way, or past the check and job timeouts
            ev["skew_s"] = self.rnd.choice([-1, 1]) * self.rnd.choice([2, 5, 30, 120])
            target.skew_clock(ev["skew_s"])
        elif kind.startswith("fill"):
            target.fill_disk()
        self.events.append(ev)
        return ev

    def heal(self, ev: dict) -> None:
        target = next(p for p in self.procs if p.name == ev["target"])
        if ev["kind"].startswith("pause"):
            target.signal(signal.SIGCONT)
        elif "partition" in ev["kind"] or "isolate" in ev["kind"]:
            self.net.heal(target.index)
        elif ev["kind"].startswith("skew"):
            target.skew_clock(0)
        elif ev["kind"].startswith("fill"):
            target.free_disk()
        ev["healed"] = time.monotonic()

    def heal_all(self) -> None:
        for p in self.procs:
            if p.paused:
                p.signal(signal.SIGCONT)
            p.skew_clock(0)
            p.free_disk()
        self.net.heal()


def _controller_loop(ctl: Controller, stop: threading.Event, masters: dict[int, set[str]]) -> None:
    while not stop.is_set():
        try:
            ctl.pass_once()
            acting: dict[int, set[str]] = {}
            for m in ctl.last_look.values():  # answering as master, not fenced, in the pass's one look
                if m.info is not None and m.info.is_master and not m.info.fenced_by:
                    acting.setdefault(m.info.epoch, set()).add(m.name)
            for epoch, names in acting.items():
                if len(names) > 1:
                    masters.setdefault(epoch, set()).update(names)
        except Exception:  # noqa: BLE001 - a pass failing must not end the controller
            log.exception("controller pass failed")
        stop.wait(0.3)


def _liveness(events: list[dict], h: workload.History, end: float) -> list[dict]:
    out = []
    commits = sorted(h.commits)
    for i, ev in enumerate(events):
        until = events[i + 1]["start"] if i + 1 < len(events) else end
        window = [ev["start"]] + [t for t in commits if ev["start"] <= t <= until] + [until]
        gap = max(b - a for a, b in zip(window, window[1:]))
        failed = sum(1 for t in h.failures if ev["start"] <= t <= until)
        out.append({"kind": ev["kind"], "target": ev["target"], "held_s": round(ev.get("healed", until) - ev["start"], 2),
                    "longest_without_commit_s": round(gap, 2), "failed_ops": failed})
    return out


def _after_promotions(failovers: list[dict], h: workload.History) -> list[dict]:
    """Per failover: how long after the promotion the first commit was acknowledged (through the
    new master: the only one that can acknowledge once the others follow it)."""
    commits = sorted(h.commits)
    out = []
    for f in failovers:
        first = next((t for t in commits if t >= f["at"]), None)
        out.append({"to": f["to"], "epoch": f["epoch"], "old_master_paused": f["old_master_paused"],
                    "first_commit_after_s": None if first is None else round(first - f["at"], 3)})
    return out


def run(seed: int, duration: float, workdir: Path, tag: str, mode: str, kinds: tuple[str, ...] = KINDS) -> dict:
    rnd = random.Random(seed)
    net = Network(tag, 3)  # made by the parent; this process only adds and removes packet filters
    procs, ctl = start_cluster(net, workdir, mode)
    try:
        return _run(rnd, seed, duration, net, procs, ctl, mode, kinds)
    finally:
        for p in procs:
            p.stop()
            p.unmount()


def _run(rnd: random.Random, seed: int, duration: float, net: Network, procs: list[BrokerProc], ctl: Controller,
         mode: str, kinds: tuple[str, ...]) -> dict:
    addresses = [p.address for p in procs]
    h = workload.History()
    stop_load, load_done, stop_ctl, consumers_done = (threading.Event() for _ in range(4))
    masters: dict[int, set[str]] = {}
    ctl_thread = threading.Thread(target=_controller_loop, args=(ctl, stop_ctl, masters), daemon=True)
    load = threading.Thread(target=workload.run, args=(addresses, h, stop_load, load_done, seed, consumers_done),
                            daemon=True)
    ctl_thread.start()
    load.start()
    nemesis = Nemesis(rnd, net, procs, ctl)
    t_end = time.monotonic() + duration
    time.sleep(2.0)
    while time.monotonic() < t_end - 3:
        ev = nemesis.inject(rnd.choice(kinds))
        time.sleep(rnd.uniform(1.0, 8.0))  # past the failover grace (2 s) about two times in three
        nemesis.heal(ev)
        time.sleep(rnd.uniform(1.0, 3.0))
    nemesis.heal_all()
    time.sleep(max(t_end - time.monotonic(), 0))
    stop_load.set()
    end = time.monotonic()
    # settle: a master serving, every transaction decided (check-back, job deadlines), published
    deadline = time.monotonic() + 60
    pending, parked = -1, 0
    while time.monotonic() < deadline:
        try:
            master = ctl.procs[ctl.master]
            admin = AdminClient(f"http://{master.ip}:10912", timeout=3)
            pending = admin.transactions("pending", limit=0).total
            parked = admin.transactions("parked", limit=0).total
            info = admin.broker_info()
            undecided = admin.jobs("undecided", limit=0).total
            if info.role == "master" and pending == 0 and undecided == 0 \
                    and info.durable_offset == info.log_end_offset:
                break
        except Exception:  # noqa: BLE001 - the master may be changing
            pass
        time.sleep(0.5)
    load_done.set()
    stop_ctl.set()
    ctl_thread.join(10)
    delivered: Counter = Counter()
    stored: dict[str, Counter] = {}
    with PullConsumer(ctl.procs[ctl.master].address, request_timeout=10) as c:
        for topic in (*workload.TOPICS, "Plain"):
            try:
                stored[topic] = Counter(m.body.decode() for m in c.read_all(topic))
            except Exception as e:  # noqa: BLE001 - a topic never written does not exist
                if "TOPIC_NOT_EXIST" not in str(e):
                    raise
                stored[topic] = Counter()
            delivered.update(stored[topic])
    # the consumer group drains what Orders holds (retries come back after their delay)
    orders = set(stored["Orders"])
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not orders <= set(h.consumed):
        time.sleep(0.5)
    consumers_done.set()
    load.join(60)
    anomalies = checker.check(h, delivered, max(pending, 0), masters)
    anomalies.update(checker.check_group(h, orders))
    lost_async = anomalies.pop("lost", []) if mode == "ASYNC" else []
    # What an ASYNC failover took away, the group may have consumed (phantoms), committed offsets
    # past (regressions), or, its offsets now past the queue's reused ones, skipped: consequences of
    # that loss, counted with it; without a loss they stay anomalies.
    after_loss = {k: anomalies.pop(k) for k in ("group lost", "group phantom", "offset regressed")
                  if lost_async and k in anomalies}
    report = {"seed": seed, "mode": mode, "kinds": len(kinds), "duration_s": duration, "faults": Counter(e["kind"] for e in nemesis.events),
              "events": [{k: v for k, v in e.items() if k not in ("start", "healed")} for e in nemesis.events],
              "failovers": len(ctl.failovers), "after_promotion": _after_promotions(ctl.failovers, h),
              "blocked_failovers": ctl.blocked,
              "operations": checker.counts(h), "commits_acknowledged": len(h.commits),
              "failed_operations": len(h.failures), "parked_after_settling": parked, "anomalies": {k: len(v) for k, v in anomalies.items()},
              "lost_under_async": len(lost_async), "lost_under_async_details": lost_async[:20],
              "group_after_async_loss": {k: len(v) for k, v in after_loss.items()},
              "group": checker.group_counts(h),
              "anomaly_details": {k: v[:20] for k, v in anomalies.items()},
              "liveness": _liveness(nemesis.events, h, end), "restarts": {p.name: p.starts - 1 for p in procs}}
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description="one fault schedule (run by python -m chaos, inside its namespace)")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--mode", choices=["SYNC", "ASYNC"], default="SYNC")
    ap.add_argument("--kinds", type=int, default=len(KINDS), help="draw faults from the first N kinds")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    report = run(args.seed, args.duration, Path(args.workdir), args.tag, args.mode, KINDS[:args.kinds])
    Path(args.report).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
