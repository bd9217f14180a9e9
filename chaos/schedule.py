"""One schedule: a cluster of broker groups, the workload, a seeded nemesis, healing, settling, the
check.

Run inside the hub namespace by `python -m chaos` (see __main__.py); writes one JSON report: the
seed, the faults injected (each with its family, group and target), the operations, the anomalies by
kind with details, and per fault the longest time without an acknowledged commit and the client
operations that failed meanwhile.

The schedule is drawn from the seed before the first fault (chaos/steps.py): one fault of every
family the schedule runs, in an order from the seed (a group is added before one is drained), then
faults of any of those families while they fit in the time; each is held 1-6 s and healed, 0.5-2 s
apart, its targets drawn from a random source of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import logging
import random
import re
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import quote

from txbroker.client import AsyncPullConsumer
from txbroker.client.admin import AdminClient
from txbroker_operator import scaling

from chaos import backup, checker, steps, workload
from chaos.broker import MODES
from chaos.cluster import Cluster, start_cluster
from chaos.nemesis import FAMILIES, INSTANT, Nemesis
from chaos.net import Network
from chaos.reader import Reader

log = logging.getLogger("chaos")
POSSIBLE_WAIT_S = 20.0  # how long a fault waits for the cluster's state to allow it before it is skipped
MAX_BROKERS = 8  # two groups of three, and a third group of two the membership family adds


def plan(rnd: random.Random, families: list[str], every_kind: bool = False) -> list[str]:
    """The faults drawn first: one of every family (both membership changes), or with `every_kind`
    every fault of every family (make test's fixed seeds: each nemesis certain to run)."""
    if every_kind:  # the instant ones first (they hold no time), a group added before one is drained
        kinds = [k for f in families for k in FAMILIES[f]]
        rnd.shuffle(kinds)
        kinds.sort(key=lambda k: (k not in INSTANT, k == "drain-group"))
        return kinds
    order = list(families)
    rnd.shuffle(order)
    kinds = []
    for f in order:
        if f == "membership":
            kinds += ["add-group", "drain-group"]
        else:
            kinds.append(rnd.choice(FAMILIES[f]))
    return kinds


def _kubelet(cluster: Cluster, nemesis: Nemesis, reader: Reader, stop: threading.Event) -> None:
    """Restarts dead brokers, reports readiness, and removes a draining group once the operator's
    rule lets it go (what it holds read first: the reader is the checker's record of it)."""
    last_drain_look = 0.0
    while not stop.is_set():
        try:
            cluster.kubelet_pass()
            g = nemesis.draining
            if g is not None and g.state == "draining" and time.monotonic() - last_drain_look > 1:
                last_drain_look = time.monotonic()
                decision = cluster.removal(g)
                g.events.append({"at": time.monotonic(), "what": "asked", "decision": type(decision).__name__,
                                 "why": decision.message})
                del g.events[:-20]  # the last answers are what a stuck drain needs
                if isinstance(decision, scaling.Remove):
                    g.events.append({"at": time.monotonic(), "what": "read before removal",
                                     "whole": asyncio.run(reader.read_to_end(g.name, g.addresses, 30))})
                    cluster.remove(g)
        except Exception:  # noqa: BLE001 - a pass failing must not end the loop
            log.exception("kubelet pass failed")
        stop.wait(0.2)


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


def _after_promotions(cluster: Cluster, h: workload.History) -> list[dict]:
    """Per failover: how long after the promotion was decided the first commit was acknowledged (on
    any group: the clients' view of the cluster)."""
    commits = sorted(h.commits)
    to_monotonic = time.monotonic() - time.time()
    out = []
    for g in cluster.groups.values():
        for f in g.status.get("failovers") or []:
            at = f["at"] + to_monotonic
            first = next((t for t in commits if t >= at), None)
            out.append({"group": g.name, "to": f["to"], "epoch": f["epoch"],
                        "first_commit_after_s": None if first is None else round(first - at, 3)})
    return out


def _drain_diagnosis(g) -> list[str]:
    """What a stuck drain's master says of what it holds: the drain, its consumer groups, each topic."""
    out = []
    try:
        admin = AdminClient(f"http://{g.master.ip}:10912", timeout=3)
        drain = admin.get("/api/v1/drain")
        out.append(f"drain: {json.dumps(drain)}")
        out.append(f"consumer groups: {json.dumps(admin.get('/api/v1/groups'))[:3000]}")
        out.append(f"transactions held: {json.dumps(admin.get('/api/v1/transactions?state=all&limit=20'))[:3000]}")
        for topic in drain.get("topics", {}):
            if not topic.startswith("("):
                out.append(f"topic {topic}: {json.dumps(admin.get('/api/v1/topics/' + quote(topic, safe='')))[:2000]}")
        out += asyncio.run(_offsets_and_reads(g, [t for t in drain.get("topics", {}) if not t.startswith("(")]))
    except Exception as e:  # noqa: BLE001 - a diagnosis, best effort
        out.append(f"(diagnosis failed: {e})")
    return out


def _parked_participants(g) -> dict[str, str] | None:
    """The participants a stuck drain waits on, by transaction id, with their homes, when all it
    holds is participants parked because their home no longer knew their transaction: an operator
    decides those (`txbroker tx list --state parked`), and the drain waits for that. None when it
    holds anything else, is not draining, or cannot be asked."""
    try:
        admin = AdminClient(f"http://{g.master.ip}:10912", timeout=3)
        drain = admin.get("/api/v1/drain")
        held = admin.get("/api/v1/transactions?state=all&limit=100000")
    except Exception:  # noqa: BLE001 - then nothing is excused
        return None
    txs = held["transactions"]
    if (not drain["draining"] or drain["undelivered"] or drain["undecided_jobs"] or drain["unreleased_jobs"]
            or drain["unreleased_decisions"] or not txs or held["total"] != len(txs)
            or any(t["state"] != "PARKED" or not t["home"] for t in txs)):
        return None
    return {t["transaction_id"]: t["home"] for t in txs}


async def _offsets_and_reads(g, topics: list[str]) -> list[str]:
    """Each consumer group's committed offsets on those topics, and what a pull there returns."""
    out = []
    async with AsyncPullConsumer(g.addresses, request_timeout=3) as c:
        for topic in topics:
            for cg in workload.CONSUMER_GROUPS:
                offsets, ends = await c.committed_offsets(cg, topic)
                if not offsets:
                    continue
                pulls = {}
                for q, o in offsets.items():
                    try:
                        r = await c.pull(topic, q, o, 4)
                        pulls[q] = [(m.queue_offset, m.body.decode(errors="replace")) for m in r.messages] or \
                            f"nothing (next {r.next_offset}, end {r.max_offset})"
                    except Exception as e:  # noqa: BLE001 - a diagnosis
                        pulls[q] = str(e)[:200]
                out.append(f"{cg} on {topic}: committed {offsets}, ends {ends}; a pull there: {pulls}")
    return out


def _dump_history(h: workload.History, reader: Reader, path: Path) -> None:
    with gzip.open(path, "wt") as f:
        json.dump({"txs": {k: vars(tx) for k, tx in h.txs.items()},
                   "read": [[*pos, body] for pos, body in reader.seen.items()],
                   "skipped": [[*k, n] for k, n in reader.skipped.items()],
                   "decisions": h.decisions, "offsets": h.offsets, "jobs": h.jobs}, f)


def _settle(cluster: Cluster, nemesis: Nemesis, timeout: float) -> dict[str, int]:
    """Until every live group's master serves with nothing pending, parked or undecided and all of its
    log published, and a draining group is gone; what each still holds when the time is up."""
    deadline = time.monotonic() + timeout
    held: dict[str, int] = {}
    while time.monotonic() < deadline:
        held = {}
        for g in cluster.live_groups:
            try:
                admin = AdminClient(f"http://{g.master.ip}:10912", timeout=3)
                info = admin.broker_info()
                n = admin.transactions("pending", limit=0).total + admin.transactions("parked", limit=0).total \
                    + admin.jobs("undecided", limit=0).total
                held[g.name] = n if info.role == "master" and info.durable_offset == info.log_end_offset else max(n, 1)
            except Exception:  # noqa: BLE001 - the master may be changing
                held[g.name] = -1
        draining = nemesis.draining is not None and nemesis.draining.state == "draining"
        if not draining and all(n == 0 for n in held.values()):
            return held
        time.sleep(0.5)
    return held  # (-1: its master could not be asked)


REPLICAS_BACK_S = 60  # a seed of a damaged store, at the harness's sizes, takes a few seconds


def _replicas_back(cluster: Cluster, timeout: float) -> dict[str, str]:
    """After settling, every fault healed: each live group's master lists all of its slaves in sync.
    A replica damaged, cut short, powered off or left behind is re-synced from its master (seeded, or
    caught up): one that is not by the deadline is named, with the slaves its master does see."""
    deadline = time.monotonic() + timeout
    while True:
        behind = {g.name: why for g in cluster.live_groups if (why := _replicas_behind(g))}
        if not behind or time.monotonic() > deadline:
            return behind
        time.sleep(0.5)


def _replicas_behind(g) -> str:
    """Why `g`'s slaves are not all in sync with its master, or "" if they are."""
    master, want = g.master, len(g.procs) - 1
    try:
        info = AdminClient(f"http://{master.ip}:10912", timeout=3).broker_info()
    except Exception as e:  # noqa: BLE001 - the master may be restarting: asked again
        return f"its master {master.name} did not answer: {e}"
    if info.role != "master":
        return f"{master.name}, its master by the controller, answers as {info.role}"
    in_sync = sorted(s.name for s in info.replication.slaves if s.in_sync)
    if len(in_sync) < want:
        return f"its master {master.name} lists {len(in_sync)} of {want} slaves in sync ({', '.join(in_sync) or 'none'})"
    return ""


def _consumed_everything(h: workload.History, reader: Reader) -> bool:
    orders = set(reader.bodies("Orders"))
    dead = set(reader.bodies(checker.DLQ))
    ordered = {k for k, tx in h.txs.items() if tx.kind == "ordered" and tx.acked == "COMMIT"}
    with h.lock:
        consumed_ordered = {f"ord-{k}-{n}" for k, seqs in h.ordered_deliveries.items() for n in seqs}
        return orders - h.poison <= set(h.consumed) and (orders & h.poison) <= dead and ordered <= consumed_ordered


def _acting(cluster: Cluster) -> dict[int, set[str]]:
    """Brokers of one group seen acting as master at one epoch in one look, from every controller."""
    out: dict[str, set[str]] = {}
    for g in cluster.groups.values():
        path = g.status_path.with_name(g.status_path.name + ".acting")
        if path.exists():
            for line in path.read_text().splitlines():
                for epoch, names in json.loads(line)["acting"].items():
                    out.setdefault(f"{g.name}@{epoch}", set()).update(names)
    return out


def _wait_until_possible(nemesis: Nemesis, kind: str, timeout: float) -> bool:
    """A fault the cluster's state forbids now (a group still re-seeding, a drain under way, a backup
    running) waits for it a while rather than giving its turn to another."""
    deadline = time.monotonic() + timeout
    while not nemesis.possible(kind):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def run(seed: int, duration: float, workdir: Path, tag: str, mode: str, families: list[str], *,
        retention_s: float = 20.0, every_kind: bool = False) -> dict:
    rnd = random.Random(seed)
    net = Network(tag, MAX_BROKERS)  # made by the parent; this process only adds and removes packet filters
    cluster = start_cluster(net, workdir, mode, retention_s=retention_s, proxied="links" in families,
                            lazy="power" in families)
    try:
        return _run(rnd, seed, duration, cluster, mode, families, retention_s, every_kind)
    finally:
        cluster.stop()


def _backups(nemesis: Nemesis, began: float) -> list[dict]:
    """Every backup the nemesis took, with its times from the schedule's start."""
    out = []
    for ev in nemesis.events:
        if ev["kind"] == "backup-slave":
            b = ev.get("backup") or {"outcome": "failed", "reason": "the backup never ended", "exit_code": None,
                                     "sent": ev["start"], "answered": ev["start"], "dir": ""}
            out.append({"group": ev["group"], "target": ev["target"], "at_s": round(b["sent"] - began, 2),
                        "took_s": round(b["answered"] - b["sent"], 2),
                        **{k: v for k, v in b.items() if k not in ("sent_wall",)}})
    return out


def _check_backups(h: workload.History, reader: Reader, backups: list[dict], cluster: Cluster, began: float,
                   anomalies: dict[str, list[str]], nemesis_events: list[dict]) -> None:
    """Each backup taken: restored into a standalone broker and judged (checker.check_restored)."""
    anomalies.update(checker.check_backups(backups))
    root = cluster.workdir / "restored"
    root.mkdir(exist_ok=True)
    for n, b in enumerate(backups):
        if b["outcome"] != "taken":
            continue
        back = int(time.monotonic() - began) + 300  # its clock before anything the schedule stamped
        try:
            restored = backup.restore_and_read(Path(b["dir"]), root, f"restored{n}", back)
        except Exception as e:  # noqa: BLE001 - e.g. the restore hung: `restored unreadable`, the schedule goes on
            restored = {"error": f"{type(e).__name__}: {e}"}
        ahead = max([e["skew_s"] for e in nemesis_events if e["kind"].startswith("skew")
                     and e["target"] == b["manifest"]["broker"] and e["skew_s"] > 0], default=0)
        found, b["checked"] = checker.check_restored(h, reader, b, restored, cluster.retention_s, ahead)
        for kind, items in found.items():
            anomalies.setdefault(kind, []).extend(items)


GROUP_NAMES = re.compile(r"\bon (g\d+(?:\+g\d+)*)")


def _groups_named(detail: str) -> set[str]:
    """The broker groups an anomaly's detail names ("t0-5 on g1+g0: ...", "(plain on g2)")."""
    m = GROUP_NAMES.search(detail)
    return set(m.group(1).split("+")) if m else set()


def _losses_allowed(mode: str, anomalies: dict, events: list[dict]) -> list[str]:
    """The acknowledged commits lost that the mode allows (taken out of `anomalies`): under ASYNC
    any; under ASYNC_FLUSH (SYNC replication) only on a group whose power was cut as a whole; under
    SYNC none."""
    if mode == "SYNC":
        return []
    lost = anomalies.pop("lost", [])
    if mode == "ASYNC_FLUSH":
        cut = {e["group"] for e in events if e["kind"] == "power-loss-group"}
        if kept := [d for d in lost if not _groups_named(d) & cut]:
            anomalies["lost"] = kept
        lost = [d for d in lost if _groups_named(d) & cut]
    return lost


def _loss_window(lost: list[str], h, events: list[dict], cluster: Cluster, to_monotonic: float) -> dict:
    """The ASYNC loss window, measured: for each acknowledged commit lost, how long before the fault
    that lost it (the first power cut or failover of its group after its acknowledgement) it was
    acknowledged. Under ASYNC flush a power cut takes at most `--flush-interval-ms` of writes; under
    ASYNC replication a failover takes what the slave had not received."""
    # (until, group, kind, at): a cut takes what was acknowledged before its brokers went down,
    # which is a few ms after its start: a commit acknowledged while it held is its, at age 0
    strikes = [(e.get("healed", e["start"]), e["group"], e["kind"], e["start"]) for e in events
               if e["kind"] in ("power-loss-group", "power-loss-broker")]
    strikes += [(f["at"] + to_monotonic, g.name, "failover", f["at"] + to_monotonic) for g in cluster.groups.values()
                for f in g.status.get("failovers") or []]
    strikes.sort(key=lambda s: s[3])  # by start: a failover while a cut holds (a restarted master stepping down) comes after it
    ages: dict[str, list[float]] = {}
    unplaced = 0
    for detail in lost:
        tx = h.txs.get(detail.split(" ", 1)[0])
        groups = _groups_named(detail)
        hit = tx is not None and next(((at, kind) for until, g, kind, at in strikes
                                       if g in groups and until >= tx.acked_at), None)
        if not hit:
            unplaced += 1
            continue
        ages.setdefault(hit[1], []).append(max(hit[0] - tx.acked_at, 0.0))
    out: dict = {"unplaced": unplaced} if unplaced else {}
    for kind, a in sorted(ages.items()):
        a.sort()
        out[kind] = {"lost": len(a), "median_ms": round(statistics.median(a) * 1000, 1),
                     "max_ms": round(a[-1] * 1000, 1)}
    return out


def _corruption_outcomes(events: list[dict], cluster: Cluster) -> dict:
    """What became of the damage done, from the damaged brokers' own logs: found while running
    (the scrub or a read: the broker stopped), seeds begun because the store was damaged (found at
    the open, or after such a stop), seeds finished. Damage can go unfound and still do no harm: a
    table compacted or retained away before a read, a log already flushed to tables."""
    damaged = Counter(e["target"] for e in events if e["family"] == "corruption" and e.get("damage"))
    out = Counter(damaged=sum(damaged.values()), brokers=len(damaged))
    for g in cluster.groups.values():
        for p in g.procs:
            if p.name in damaged and p.log_path.exists():
                lines = p.log_path.read_text(errors="replace").splitlines()
                out["found while running"] += sum("the store is damaged (" in line for line in lines)
                out["seeds for damage"] += sum("seeding the store from master" in line and "damaged" in line
                                               for line in lines)
                out["seeded"] += sum("store seeded from master" in line for line in lines)
    return dict(out)


def _truncations(cluster: Cluster) -> dict[str, int]:
    """Per broker, the times it cut its log's tail on rejoining a new master (records the master did
    not have: a deposed master's unreplicated writes), with retention running meanwhile: where the
    second review found acknowledged commits lost, so the report says how often schedules got there."""
    out = {}
    for g in cluster.groups.values():
        for p in g.procs:
            if p.log_path.exists():
                n = p.log_path.read_text(errors="replace").count("truncating the log after LSN")
                if n:
                    out[p.name] = n
    return out


def _consequences_of_async_loss(anomalies: dict, lost_async: list[str], cluster: Cluster,
                                h: workload.History, drain_parked: dict[str, str] | None = None
                                ) -> dict[str, list[str]]:
    """What an ASYNC failover or a whole group's power loss took away, the groups may have consumed
    (phantoms), committed offsets past (regressions) or skipped; a spanning transaction or job may
    have lost its part on that group (torn), a participant whose home lost its transaction is parked
    for an operator (unresolved), and a poison message whose retry was lost never reaches the dead
    letters; a job's decision acknowledged and lost on its home comes back otherwise (decision
    changed), and an orderly consumer past a rewritten position meets a retried send late (order
    broken). A draining group that holds only participants parked that way (`drain_parked`: their
    transactions' homes), each of a workload transaction whose home lost something, waits for an
    operator's decision on them and stays draining. Those are consequences of the loss, counted with
    it (removed from `anomalies`), on the group that lost something (an unresolved participant and
    a drain waiting on one also where its home lost it); without a loss they stay anomalies, and so
    does every one of them on a group that lost nothing."""
    lossy = set().union(*(_groups_named(d) for d in lost_async)) if lost_async else set()
    lossy |= {g.name for g in cluster.groups.values()
              if any("may lack" in f.get("message", "") for f in g.status.get("failovers") or [])}
    if not lossy:
        return {}
    after: dict[str, list[str]] = {}
    names = set(cluster.groups)
    by_body = {b: tx for tx in h.txs.values() for b in tx.bodies}
    # a participant on another group parks (or waits) when its home lost the transaction
    homes_lost = {g for tx in h.txs.values() if len(tx.groups) > 1 and tx.groups[0] in lossy for g in tx.groups}

    def groups_of(detail: str) -> set[str]:
        """"g1: ...", "g1 Orders:3 ...", "g1 chaos-cg queue 2: ..." name their group; "<body>: ..."
        is on its transaction's groups (none known when its send went unanswered: then it stays)."""
        head = detail.split(":", 1)[0].split(" ", 1)[0]
        if head in names:
            return {head}
        return _groups_named(detail) or set(getattr(by_body.get(head), "groups", None) or ())

    def on_lossy_group(kind: str, where, lossy=lossy) -> None:
        kept, moved = [], []
        for d in anomalies.get(kind, []):
            (moved if where(d) & lossy else kept).append(d)
        if moved:
            after[kind] = moved
            if kept:
                anomalies[kind] = kept
            else:
                del anomalies[kind]
    for kind in ("group lost", "group phantom", "offset regressed", "ordered lost", "rewritten", "went back"):
        on_lossy_group(kind, groups_of)
    on_lossy_group("unresolved", groups_of, lossy | homes_lost)
    if drain_parked and "drain stuck" in anomalies and all(
            home in lossy and (tx := h.txs.get(txid)) is not None and tx.groups[:1] == [home]
            for txid, home in drain_parked.items()):
        after["drain stuck"] = anomalies.pop("drain stuck")
    on_lossy_group("torn", _groups_named)
    # "key k0: first delivered 188 before 187 ...": a cut rewrote a position the orderly consumer had
    # consumed and committed past, so a send retried through the cut came after later ones (seed 708)
    def groups_of_order(detail: str) -> set[str]:
        key = detail.split(" ", 2)[1].rstrip(":")
        numbers = {n for pair in re.findall(r"(\d+) before (\d+)", detail) for n in pair}
        return {g for n in numbers for g in getattr(by_body.get(f"ord-{key}-{n}"), "groups", None) or ()}
    on_lossy_group("order broken", groups_of_order)
    # "job <id>: ...": a decision acknowledged and then lost with its home's log (seed 708)
    on_lossy_group("decision changed", lambda d: {h.jobs.get(d.split(" ", 2)[1].rstrip(":"))} - {None})
    # "t0-8607.0.poison: poison in Orders, ...": the groups of the transaction that sent it
    on_lossy_group("dead letter", lambda d: set(getattr(by_body.get(d.split(":", 1)[0]), "groups", None) or ()))
    return after


def _run(rnd: random.Random, seed: int, duration: float, cluster: Cluster, mode: str, families: list[str],
         retention_s: float, every_kind: bool) -> dict:  # noqa: C901 - one schedule, start to end, in one piece
    h = workload.History()
    groups_now = lambda: {g.name: g.addresses for g in cluster.live_groups}  # noqa: E731
    reader = Reader(groups_now)
    stop_load, load_done, stop_kubelet, consumers_done = (threading.Event() for _ in range(4))
    nemesis = Nemesis(rnd, cluster, hows=["truncate", "bitflip"] if every_kind else None)
    kubelet = threading.Thread(target=_kubelet, args=(cluster, nemesis, reader, stop_kubelet), daemon=True)
    load = threading.Thread(target=workload.run, args=(cluster.bootstrap(), groups_now, h, reader, stop_load,
                                                       load_done, seed, consumers_done), daemon=True)
    kubelet.start()
    load.start()
    began = time.monotonic()
    t_end = began + duration
    time.sleep(2.0)
    # held past the failover grace (2 s) about three times in five; one group is added per schedule
    schedule = steps.draw(rnd, plan(rnd, families, every_kind),
                          [k for f in families for k in FAMILIES[f] if k != "add-group"], duration,
                          hold_s=(1.0, 6.0), gap_s=(0.5, 2.0), instant=frozenset(INSTANT))
    skipped_steps = []
    for i, step in enumerate(schedule):
        nemesis.rnd = steps.for_step(seed, i)
        if not _wait_until_possible(nemesis, step.kind, POSSIBLE_WAIT_S):
            skipped_steps.append({"step": i, "kind": step.kind, "at_s": round(time.monotonic() - began, 2)})
            continue
        ev = nemesis.inject(step.kind)
        time.sleep(step.hold_s)
        nemesis.heal(ev)
        time.sleep(step.gap_s)
    nemesis.heal_all()
    time.sleep(max(t_end - time.monotonic(), 0))
    stop_load.set()
    end = time.monotonic()
    # settle: every group's master serving, every transaction and job decided, published, drained
    unresolved = _settle(cluster, nemesis, 90)
    load_done.set()
    deadline = time.monotonic() + 90  # the consumer groups finish what the groups hold (retries come back)
    while time.monotonic() < deadline and not _consumed_everything(h, reader):
        time.sleep(0.5)
    consumers_done.set()
    load.join(60)
    read_whole = asyncio.run(reader.catch_up(time.monotonic() + 60))
    replicas_behind = _replicas_back(cluster, REPLICAS_BACK_S)  # the kubelet still restarts what exits
    stop_kubelet.set()
    kubelet.join(10)
    anomalies = checker.check(h, reader, unresolved, _acting(cluster))
    route_changed = any(e["kind"] in ("add-group", "drain-group") for e in nemesis.events)
    anomalies.update(checker.check_groups(h, reader, route_changed, cluster.retention_s))
    nemesis.wait_backups(150)
    backups = _backups(nemesis, began)
    _check_backups(h, reader, backups, cluster, began, anomalies, nemesis.events)
    moved = anomalies.pop("reordered where the key moved", [])
    reordered = anomalies.pop("reordered after a route change", [])
    unverified = anomalies.pop("unverified", [])
    skipped = anomalies.pop("skipped by retention", [])
    g = nemesis.draining
    drain_parked = None
    if g is not None and g.state == "draining":
        last = next((e["why"] for e in reversed(g.events) if e["what"] == "asked"), "never asked")
        anomalies.setdefault("drain stuck", []).extend([f"{g.name} still draining after settling: {last}",
                                                        *_drain_diagnosis(g)])
        drain_parked = _parked_participants(g)
    for name, why in sorted(replicas_behind.items()):
        anomalies.setdefault("replica not re-synced", []).append(
            f"{name}: {REPLICAS_BACK_S} s after settling, {why}")
    if not read_whole:
        anomalies.setdefault("harness", []).append("the reader could not read every group to its end")
    lost_async = _losses_allowed(mode, anomalies, nemesis.events)
    # under ASYNC a slave in sync holds its master's writes up to its last heartbeat (docs/backup.md)
    restored_lost_async = anomalies.pop("restored lost", []) if mode == "ASYNC" else []
    after_loss = (_consequences_of_async_loss(anomalies, lost_async, cluster, h, drain_parked)
                  if mode != "SYNC" else {})
    events = nemesis.events
    to_monotonic = time.monotonic() - time.time()
    if anomalies or lost_async:  # the whole history beside the report, for the operations around each anomaly
        _dump_history(h, reader, cluster.workdir / "history.json.gz")
    return {"seed": seed, "mode": mode, "families": families, "duration_s": duration, "retention_s": retention_s,
            "faults": Counter(e["kind"] for e in events),
            "faults_by_family": Counter(e["family"] for e in events),
            "schedule": steps.as_report(schedule), "skipped_steps": skipped_steps,
            "events": [{**{k: v for k, v in e.items() if k not in ("start", "healed", "backup")},
                        "at_s": round(e["start"] - began, 2),
                        **({"held_s": round(e["healed"] - e["start"], 2)} if "healed" in e else {})} for e in events],
            "failover_log": {g.name: [{**f, "at_s": round(f["at"] + to_monotonic - began, 2)}
                                      for f in g.status.get("failovers") or []] for g in cluster.groups.values()},
            "failovers": sum(len(g.status.get("failovers") or []) for g in cluster.groups.values()),
            "after_promotion": _after_promotions(cluster, h),
            "blocked_failovers": {g.name: g.status.get("blocked") or {} for g in cluster.groups.values()},
            "controller_starts": {g.name: g.controller_starts for g in cluster.groups.values()},
            "membership": {g.name: [{k: v for k, v in e.items() if k != "at"} for e in g.events]
                           for g in cluster.groups.values() if g.events},
            "route_versions": cluster.route_version,
            "operations": checker.counts(h), "commits_acknowledged": len(h.commits),
            # the coverage of `properties lost`: member messages read carrying their job's id
            "members_read_with_their_job": sum(1 for jobs in reader.member_jobs.values() if None not in jobs),
            "failed_operations": len(h.failures), "unresolved_after_settling": unresolved,
            "anomalies": {k: len(v) for k, v in anomalies.items()},
            "anomaly_details": {k: v[:20] for k, v in anomalies.items()},
            "lost_under_async": len(lost_async), "lost_under_async_details": lost_async[:20],
            "loss_window": _loss_window(lost_async, h, events, cluster, to_monotonic),
            "backups": [{k: v for k, v in b.items() if k not in ("sent", "answered", "dir")} for b in backups],
            "backup_outcomes": Counter(b["outcome"] for b in backups),
            "backups_restored_and_checked": sum(1 for b in backups if "checked" in b),
            "restored_lost_under_async": len(restored_lost_async),
            "restored_lost_under_async_details": restored_lost_async[:20],
            "group_after_async_loss": {k: len(v) for k, v in after_loss.items()},
            "group_after_async_loss_details": {k: v[:20] for k, v in after_loss.items()},
            "reordered_where_the_key_moved": len(moved), "reordered_where_the_key_moved_details": moved[:20],
            "reordered_after_route_change": len(reordered), "reordered_after_route_change_details": reordered[:20],
            "unverified": len(unverified), "unverified_details": unverified[:20],
            "skipped_by_retention": len(skipped), "skipped_details": skipped[:20],
            "keys_checked": reader.keys_checked, "keys_gone_before_checked": reader.keys_gone,
            "group": checker.group_counts(h, reader),
            "liveness": _liveness(events, h, end),
            "restarts": {p.name: p.starts - 1 for g in cluster.groups.values() for p in g.procs},
            "exit_codes": {p.name: Counter(p.exits) for g in cluster.groups.values() for p in g.procs if p.exits},
            "corruption": _corruption_outcomes(events, cluster),
            "truncations": _truncations(cluster)}


def main() -> int:
    ap = argparse.ArgumentParser(description="one fault schedule (run by python -m chaos, inside its namespace)")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--mode", choices=MODES, default="SYNC")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--retention", type=float, default=20.0, help="seconds (0: none)")
    ap.add_argument("--every-kind", action="store_true", help="draw every fault of the families first")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still tears its cluster down
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    report = run(args.seed, args.duration, Path(args.workdir), args.tag, args.mode, args.families.split(","),
                 retention_s=args.retention, every_kind=args.every_kind)
    Path(args.report).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
