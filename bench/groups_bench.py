#!/usr/bin/env python3
"""Broker groups (tracker issue 18): aggregate transactions/s and CPU per transaction for 1 and 2
groups on this machine, a transaction spanning groups against one that stays on one, and a scaling
model for more groups on a bigger machine.

    .venv/bin/python bench/groups_bench.py                 # ASYNC flush, masters only (about 4 min)
    .venv/bin/python bench/groups_bench.py --sync          # SYNC flush + SYNC replication, 1 slave per group
    .venv/bin/python bench/groups_bench.py --quick         # smoke run: 3 s per case, one run
    .venv/bin/python bench/groups_bench.py --model-from bench/results/groups-<ts>.json   # the model again

Per run a fresh cluster: N groups, each a `txbroker broker --group gI --cluster-file route.json`
master (with --sync also a slave), the route listing every group. Load: bench/broker's load
generator (network.py + loadgen.py: separate uvloop client processes, closed loop, one transaction
in flight per producer, 1 KiB bodies, warm-up then a measured window), its producers swapped for
AsyncClusterTransactionProducer (bootstrap from one broker, route learnt). Without a selector a
transaction goes whole to one group, the next in turn; the `span` cases send 2-message transactions
with a selector that puts message 1 on g0 and message 2 on g1 (a home half message, a participant,
the decision told to both), beside 2-message transactions on one group (`local`).

Measured over the window, from /proc: every broker process's CPU (all its threads; the event-loop
thread apart), the client processes' CPU, and the rest of the machine ("others"). CPU per
transaction is what all brokers together spent per committed transaction. The machine has 2 cores
shared by brokers and clients: the clients' share of them is printed beside every figure.

The scaling model (printed after the table, also in the JSON) takes the measured broker CPU per
transaction and assumes one core per group broker, clients on other machines, no other limit:
aggregate tx/s = N / ((1 - f) * c_local + f * c_span) for N groups and a fraction f of
transactions that span two groups. It is a model, not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
import urllib.error
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH / "broker")]

CLIENT_ENV = "TXBROKER_GROUPS_BENCH_CLIENT"  # set: this file runs as a load-generator client (see client_main)


# ---- the client side: loadgen.py with cluster producers --------------------------------------------

def client_main(argv: list[str]) -> int:
    """bench/broker/loadgen.py, its AsyncTransactionProducer replaced by a cluster producer. The
    environment says how to place a transaction's messages: "single" (no selector: the whole
    transaction to one group, the next in turn) or "span:N" (message i to group i mod N)."""
    import loadgen  # noqa: PLC0415  (bench/broker/loadgen.py)
    from txbroker.client import AsyncClusterTransactionProducer  # noqa: PLC0415

    how = os.environ[CLIENT_ENV]
    groups = int(how.split(":")[1]) if how.startswith("span:") else 0

    class Producer(AsyncClusterTransactionProducer):
        async def send_message_in_transaction(self, msg_or_msgs, arg=None, transaction_id=None):
            if not (groups and isinstance(msg_or_msgs, list) and len(msg_or_msgs) > 1):
                return await super().send_message_in_transaction(msg_or_msgs, arg, transaction_id)
            position = {id(m): i for i, m in enumerate(msg_or_msgs)}

            def by_position(total, m, _arg):  # the groups' queues in route order, equal counts
                per = total // groups
                return (position[id(m)] % groups) * per + random.randrange(per)
            return await super().send_message_in_transaction(msg_or_msgs, arg, transaction_id, selector=by_position)

    loadgen.AsyncTransactionProducer = Producer
    return loadgen.main(argv)


if os.environ.get(CLIENT_ENV) and __name__ == "__main__":
    sys.exit(client_main(sys.argv[1:]))

import network  # noqa: E402  (bench/broker/network.py)
from common import (  # noqa: E402  (bench/broker/common.py)
    RESULTS_DIR, BrokerProcess, CpuSnapshot, host_speed_ms, loadavg, machine_info, process_cpu, thread_cpu,
)
from network import Spec  # noqa: E402


# ---- a cluster of broker groups ---------------------------------------------------------------------

class Cluster:
    """N groups of `txbroker broker` processes (common.BrokerProcess), one route file for all."""

    def __init__(self, groups: int, flush: str = "ASYNC", slaves: int = 0, extra: list[str] | None = None):
        self.dir = tempfile.mkdtemp(prefix="txbroker-groups-")
        self.route = Path(self.dir) / "route.json"
        self.flush, self.slaves = flush, slaves
        self.groups: list[list[BrokerProcess]] = []
        for i in range(groups):
            name, members = f"g{i}", []
            for k in range(1 + slaves):
                args = ["--group", name, "--cluster-file", str(self.route), "--broker-name", f"{name}-{k}"]
                if slaves:
                    args += ["--replication-mode", "SYNC"]
                if k:
                    args += ["--role", "slave", "--master", members[0].address]
                members.append(BrokerProcess(flush, data_dir=os.path.join(self.dir, f"{name}-{k}"),
                                             extra=args + list(extra or [])))
            self.groups.append(members)
        self.route.write_text(json.dumps({"cluster": "bench", "version": 1, "groups": [
            {"name": f"g{i}", "addresses": [b.address for b in g]} for i, g in enumerate(self.groups)]}))

    @property
    def masters(self) -> list[BrokerProcess]:
        return [g[0] for g in self.groups]

    @property
    def brokers(self) -> dict[str, int]:
        """broker name -> pid, every broker of the cluster"""
        return {f"g{i}-{k}": b.pid for i, g in enumerate(self.groups) for k, b in enumerate(g)}

    @property
    def bootstrap(self) -> str:
        return self.masters[0].address  # any broker would do

    def start(self) -> "Cluster":
        try:
            for b in self.masters:
                b.start()
            for g in self.groups:
                for s in g[1:]:
                    s.start()
            deadline = time.monotonic() + 60
            for g in self.groups:
                while self.slaves and self._in_sync(g[0]) < self.slaves:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{g[0].address}: slaves not in sync after 60 s")
                    time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _in_sync(master: BrokerProcess) -> int:
        with master.open_admin("/api/v1/broker") as r:
            doc = json.load(r)
        return sum(bool(s.get("in_sync")) for s in doc.get("replication", {}).get("slaves", []))

    def create_topic(self, name: str, queues: int) -> None:
        """The topic on every group's master, `queues` queues each (idempotent)."""
        for b in self.masters:
            try:
                b.create_topic(name, queues)
            except urllib.error.HTTPError as e:
                if e.code != 409:
                    raise

    def stop(self) -> None:
        for g in self.groups:
            for b in reversed(g):
                if b.proc is not None:
                    b.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def describe(self) -> dict:
        return {"groups": len(self.groups), "slaves_per_group": self.slaves, "flush": self.flush,
                "route": json.loads(self.route.read_text()) if self.route.exists() else None,
                "broker_commands": [shlex.join(b.cmd) for g in self.groups for b in g]}


class _Handle:
    """Stands in for network.py's BrokerProcess: a cluster (fresh per run, or one shared)."""

    def __init__(self, make, shared: Cluster | None = None):
        self._make, self.cluster = make, shared
        self._own = shared is None

    def __enter__(self):
        if self._own:
            self.cluster = self._make().start()
        _Handle.current = self.cluster
        c = self.cluster
        self.cmd = c.masters[0].cmd
        self.ready_seconds = max(b.ready_seconds for b in c.masters)
        self.address = c.bootstrap
        return self

    pid = property(lambda self: self.cluster.masters[0].pid)

    def create_topic(self, name: str, queues: int) -> None:
        self.cluster.create_topic(name, queues)

    def flush_stats(self) -> dict:
        return {}

    def stop(self):
        return None

    def __exit__(self, *exc):
        if self._own:
            self.cluster.stop()


class _ClusterCpu(CpuSnapshot):
    """network.py's CPU snapshot, its "broker" the sum over every broker of the current cluster
    (main = the event-loop threads summed), each broker also apart."""

    def __init__(self, _broker_pid, client_pids):
        super().__init__(None, client_pids)
        brokers = _Handle.current.brokers
        self.each = {n: process_cpu(p) for n, p in brokers.items()}
        self.each_loop = {n: thread_cpu(p, p) for n, p in brokers.items()}
        self.broker = sum(self.each.values())
        self.broker_threads = {"main": sum(self.each_loop.values())}

    def since(self, earlier: "_ClusterCpu") -> dict:
        out = super().since(earlier)
        dt_ = self.t - earlier.t
        out["per_broker_pct"] = {n: round(100 * (v - earlier.each.get(n, 0.0)) / dt_, 1) for n, v in self.each.items()}
        out["per_broker_loop_pct"] = {n: round(100 * (v - earlier.each_loop.get(n, 0.0)) / dt_, 1)
                                      for n, v in self.each_loop.items()}
        return out


@contextlib.contextmanager
def on_cluster(placement: str, make=None, shared: Cluster | None = None):
    """network.run / run_once against a cluster: fresh from `make()` per run, or `shared`; clients
    are cluster producers placing transactions as `placement` says ("single" or "span:N")."""
    saved = network.BrokerProcess, network.CpuSnapshot, network.LOADGEN, os.environ.get(CLIENT_ENV)
    network.BrokerProcess = lambda flush, data_dir=None: _Handle(make, shared)
    network.CpuSnapshot = _ClusterCpu
    network.LOADGEN = str(Path(__file__).resolve())
    os.environ[CLIENT_ENV] = placement
    try:
        yield
    finally:
        network.BrokerProcess, network.CpuSnapshot, network.LOADGEN, env = saved
        if env is None:
            os.environ.pop(CLIENT_ENV, None)
        else:
            os.environ[CLIENT_ENV] = env


# ---- the cases ---------------------------------------------------------------------------------------

def cases(duration: float, warmup: float, concurrency: list[int]) -> list[tuple[int, str, Spec]]:
    """(groups, placement, spec)"""
    out = []

    def S(name, n, batch=1):
        return Spec(name=name, mode="tx", producers=n, procs=1 if n <= 8 else 2, batch=batch, queues=8,
                    duration=duration, warmup=warmup)

    for g in (1, 2):
        out += [(g, "single", S(f"g{g}-tx-{n}p", n)) for n in concurrency]
    for n in concurrency:
        out.append((2, "single", S(f"g2-tx2-local-{n}p", n, batch=2)))
        out.append((2, "span:2", S(f"g2-tx2-span-{n}p", n, batch=2)))
    return out


def summarize(groups: int, placement: str, entry: dict) -> dict:
    runs = entry["runs"]
    best = runs[entry["best_index"]]
    cpu, rate = best["cpu"], best["ops_per_s"]
    per = lambda pct: round(pct / 100 / rate * 1e6, 1) if rate else None  # noqa: E731  us per tx
    masters = {n: v for n, v in cpu["per_broker_pct"].items() if n.endswith("-0")}
    return {
        "name": entry["name"], "groups": groups, "placement": placement, "producers": entry["spec"]["producers"],
        "messages_per_tx": entry["spec"]["batch"],
        "tx_per_s_best": round(rate), "tx_per_s_runs": [round(r["ops_per_s"]) for r in runs],
        "p50_ms": best["latency_ms"].get("p50"), "p99_ms": best["latency_ms"].get("p99"),
        "errors": sum(sum(r["errors"].values()) for r in runs),
        "brokers_pct": cpu["broker_pct"], "per_broker_pct": cpu["per_broker_pct"],
        "per_broker_loop_pct": cpu["per_broker_loop_pct"],
        "broker_cpu_us_per_tx": per(cpu["broker_pct"]),  # every broker of the cluster, all threads
        "master_cpu_us_per_tx": per(sum(masters.values())),
        "master_loop_cpu_us_per_tx": per(sum(v for n, v in cpu["per_broker_loop_pct"].items() if n.endswith("-0"))),
        "broker_loop_cpu_us_per_tx": per(cpu["broker_main_thread_pct"]),
        "clients_pct": cpu["clients_pct"], "client_cpu_us_per_tx": per(cpu["clients_pct"]),
        # of the machine's ceiling (ncpu cores = ncpu * 100 %): what the load generator took
        "clients_share_of_machine_pct": round(cpu["clients_pct"] / (os.cpu_count() or 1), 1),
        "machine_busy_pct": cpu["machine_busy_pct"], "others_pct": cpu["others_pct"],
        "host_speed_ms": best.get("host_speed_ms"), "loadavg_after": best.get("loadavg_after"),
    }


def table(rows: list[dict]) -> list[str]:
    ncpu = os.cpu_count() or 1
    hdr = ["case", "groups", "msgs/tx", "producers", "tx/s (runs)", "p50 / p99 ms", "broker CPU us/tx",
           "loop us/tx", "brokers % (each)", f"clients % of {ncpu * 100}", "others %", "host ms"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "|".join("---" for _ in hdr) + "|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['name']} | ERROR {r['error'][:150]} |")
            continue
        each = ", ".join(f"{v:.0f}" for v in r["per_broker_pct"].values())
        runs = " / ".join(f"{x:,}" for x in r["tx_per_s_runs"])
        lines.append(f"| {r['name']}{' ERRORS ' + str(r['errors']) if r['errors'] else ''} | {r['groups']} | "
                     f"{r['messages_per_tx']} | {r['producers']} | **{r['tx_per_s_best']:,}** ({runs}) | "
                     f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} | {r['broker_cpu_us_per_tx']} | "
                     f"{r['broker_loop_cpu_us_per_tx']} | {r['brokers_pct']:.0f} ({each}) | "
                     f"{r['clients_pct']:.0f} ({r['clients_share_of_machine_pct']:.0f} % of the machine) | "
                     f"{r['others_pct']:.0f} | {r['host_speed_ms']:.0f} |")
    return lines


# ---- the scaling model ---------------------------------------------------------------------------------

MODEL_GROUPS = (4, 8, 16)
MODEL_F = (0.0, 0.1, 0.5)


def model(rows: list[dict]) -> dict:
    """Aggregate tx/s for more groups from the measured broker CPU per transaction (a model)."""
    by = {r["name"]: r for r in rows if not r.get("error")}
    out = {"assumptions": [
        "one core per group's master for everything its process does (event loop, RocksDB threads); slaves, "
        "clients and the network on other cores or machines; no limit but those cores",
        "cost per transaction as measured here with 2 groups (the masters' CPU / committed transactions), "
        "independent of the number of groups: linear in groups while cores suffice, the load spread evenly",
        "a fraction f of transactions spans two groups (2 messages, one on each) and costs the measured "
        "g2-tx2-span CPU; the rest stay on one group at the measured g2-tx2-local cost",
        "the per-group concurrency of the measurement (producers / 2 per group) is kept: N groups are driven "
        "by N/2 times as many producers",
        "upper figure: the event-loop thread alone bounds a group (other threads of its process on spare cores)",
        "'from 1 group's cost': the same with the single-message cost measured with ONE group at the same total "
        "producers (its broker not sharing the 2 cores with a second one; twice the producers per group)",
        "a core fully used: the single-group suite saw a saturated loop at 85-90 % busy, and the CPU per "
        "transaction measured here is at this machine's load (it falls somewhat as a loop gets busier: "
        "group commit and answer coalescing batch more); read the figures as +-15 %",
    ], "by_concurrency": {}}
    for key in sorted({r["producers"] for r in by.values()}):
        one, alone = by.get(f"g2-tx-{key}p"), by.get(f"g1-tx-{key}p")
        loc, span = by.get(f"g2-tx2-local-{key}p"), by.get(f"g2-tx2-span-{key}p")
        if not one:
            continue
        m = {"c1_us": one["master_cpu_us_per_tx"], "c1_loop_us": one["master_loop_cpu_us_per_tx"],
             "client_us": one["client_cpu_us_per_tx"]}
        if alone:  # one group's broker, not sharing the cores with another: nearer the model's one core each
            m["c1_one_group_us"] = alone["master_cpu_us_per_tx"]
        if loc and span:
            m.update(c_local_us=loc["master_cpu_us_per_tx"], c_span_us=span["master_cpu_us_per_tx"],
                     c_local_loop_us=loc["master_loop_cpu_us_per_tx"], c_span_loop_us=span["master_loop_cpu_us_per_tx"],
                     span_cost_ratio=round(span["master_cpu_us_per_tx"] / loc["master_cpu_us_per_tx"], 2))
        rows_ = {}
        for n in MODEL_GROUPS:
            row = {"single_msg_tx_per_s": round(n * 1e6 / m["c1_us"]),
                   "single_msg_tx_per_s_loop_bound": round(n * 1e6 / m["c1_loop_us"]),
                   "client_cores_needed": round(n * 1e6 / m["c1_us"] * m["client_us"] / 1e6, 1)}
            if "c1_one_group_us" in m:
                row["single_msg_tx_per_s_one_group_cost"] = round(n * 1e6 / m["c1_one_group_us"])
            if "c_span_us" in m:
                for f in MODEL_F:
                    row[f"two_msg_f{f:g}_tx_per_s"] = round(n * 1e6 / ((1 - f) * m["c_local_us"] + f * m["c_span_us"]))
                    row[f"two_msg_f{f:g}_tx_per_s_loop_bound"] = round(
                        n * 1e6 / ((1 - f) * m["c_local_loop_us"] + f * m["c_span_loop_us"]))
            rows_[n] = row
        m["groups"] = rows_
        out["by_concurrency"][f"{key // 2}_producers_per_group"] = m
    return out


def model_lines(mod: dict) -> list[str]:
    lines = ["SCALING MODEL (not a measurement): aggregate tx/s = N / ((1 - f) * c_local + f * c_span), "
             "from the masters' CPU per transaction measured with 2 groups. Assumptions:"]
    lines += [f"  - {a}" for a in mod["assumptions"]]
    for key, m in mod["by_concurrency"].items():
        lines.append("")
        lines.append(f"{key.replace('_', ' ')}: c1 {m['c1_us']} us/tx (loop {m['c1_loop_us']}), clients "
                     f"{m['client_us']} us/tx" + (f"; 2-message tx: on one group {m['c_local_us']} us, spanning 2 "
                     f"groups {m['c_span_us']} us ({m['span_cost_ratio']}x)" if "c_span_us" in m else ""))
        hdr = ["groups", "1-msg tx/s (loop-bound)", "client cores needed"]
        if "c1_one_group_us" in m:
            hdr.insert(2, f"1-msg tx/s from 1 group's cost ({m['c1_one_group_us']} us)")
        if "c_span_us" in m:
            hdr += [f"2-msg tx/s, f={f:g} (loop-bound)" for f in MODEL_F]
        lines += ["| " + " | ".join(hdr) + " |", "|" + "|".join("---" for _ in hdr) + "|"]
        for n, row in m["groups"].items():
            cells = [str(n), f"{row['single_msg_tx_per_s']:,} ({row['single_msg_tx_per_s_loop_bound']:,})",
                     f"{row['client_cores_needed']}"]
            if "c1_one_group_us" in m:
                cells.insert(2, f"{row['single_msg_tx_per_s_one_group_cost']:,}")
            if "c_span_us" in m:
                cells += [f"{row[f'two_msg_f{f:g}_tx_per_s']:,} ({row[f'two_msg_f{f:g}_tx_per_s_loop_bound']:,})"
                          for f in MODEL_F]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


# ---- main ----------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sync", action="store_true", help="SYNC flush and SYNC replication, one slave per group "
                    "(default: ASYNC flush, masters only: the brokers' CPU ceiling)")
    ap.add_argument("--concurrency", default="8,32", help="producers (closed loop, one transaction in flight each)")
    ap.add_argument("--repeats", type=int, help="runs per case, best kept (default 2, quick 1)")
    ap.add_argument("--duration", type=float, help="measured seconds per run (default 10, quick 3)")
    ap.add_argument("--warmup", type=float, help="unmeasured seconds before (default 2, quick 1)")
    ap.add_argument("--only", help="comma-separated case names (e.g. g2-tx-8p,g2-tx2-span-8p)")
    ap.add_argument("--quick", action="store_true", help="smoke run")
    ap.add_argument("--model-from", metavar="JSON", help="run nothing: print the table and model of a result file")
    a = ap.parse_args(argv)
    if a.model_from:
        doc = json.loads(Path(a.model_from).read_text())
        print("\n".join(table(doc["summary"]) + [""] + model_lines(model(doc["summary"]))))
        return 0
    repeats = a.repeats or (1 if a.quick else 2)
    duration = a.duration or (3.0 if a.quick else 10.0)
    warmup = a.warmup if a.warmup is not None else (1.0 if a.quick else 2.0)
    flush, slaves = ("SYNC", 1) if a.sync else ("ASYNC", 0)
    todo = cases(duration, warmup, [int(x) for x in a.concurrency.split(",")])
    if a.only:
        keep = set(a.only.split(","))
        todo = [c for c in todo if c[2].name in keep]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS_DIR / f"groups-{stamp}{'-sync' if a.sync else ''}{'-quick' if a.quick else ''}.json"
    doc = {"benchmark": "txbroker broker groups (tracker issue 18)", "started_utc": stamp,
           "command": shlex.join([sys.executable] + sys.argv), "machine": machine_info(),
           "host_speed_ms_at_start": host_speed_ms(), "loadavg_at_start": loadavg(),
           "settings": {"flush": flush, "slaves_per_group": slaves, "replication": "SYNC" if slaves else None,
                        "repeats": repeats, "duration_s": duration, "warmup_s": warmup, "message_size": 1024,
                        "queues_per_group": 8},
           "runs": [], "summary": []}
    print(f"broker groups: {flush} flush, {slaves} slave(s) per group, {repeats} x {duration:g} s "
          f"(+{warmup:g} s warm-up) per case; load {doc['loadavg_at_start']}; -> {out}", flush=True)
    started = time.monotonic()
    entries: dict[str, dict] = {}
    for round_ in range(repeats):  # the cases interleaved run by run: the shared host's speed drifts
        for groups, placement, spec in todo:
            spec.flush = flush
            print(f"{spec.name} (round {round_ + 1}/{repeats}): {groups} group(s), {spec.producers} producers in "
                  f"{spec.procs} process(es), {spec.batch} message(s) per tx, placement {placement}", flush=True)
            e = entries.setdefault(spec.name, {"name": spec.name, "groups": groups, "placement": placement,
                                               "spec": None, "runs": [], "failures": []})
            try:
                with on_cluster(placement, make=lambda g=groups: Cluster(g, flush, slaves)):
                    got = network.run(spec, 1, log=lambda s: print(s, flush=True))
                e["spec"] = got["spec"]
                e["runs"] += got["runs"]
            except Exception as ex:  # noqa: BLE001 - report it, go on with the next case
                print(f"  FAILED: {type(ex).__name__}: {ex}", flush=True)
                e["failures"].append(f"{type(ex).__name__}: {ex}")
            doc["runs"] = list(entries.values())
            out.write_text(json.dumps(doc, indent=1, default=str))
    for e in entries.values():
        if e["runs"]:
            e["best_index"] = max(range(len(e["runs"])), key=lambda i: e["runs"][i]["ops_per_s"])
            e["summary"] = summarize(e["groups"], e["placement"], e)
        else:
            e["summary"] = {"name": e["name"], "groups": e["groups"], "error": "; ".join(e["failures"])}
        doc["summary"].append(e["summary"])
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    doc["loadavg_at_end"] = loadavg()
    doc["table"] = table(doc["summary"])
    doc["model"] = model(doc["summary"])
    doc["model_lines"] = model_lines(doc["model"])
    out.write_text(json.dumps(doc, indent=1, default=str))
    print("\n" + "\n".join(doc["table"]) + "\n\n" + "\n".join(doc["model_lines"]))
    print(f"\nwrote {out} in {doc['elapsed_s']:.0f} s")
    return 1 if any(s.get("error") for s in doc["summary"]) else 0


if __name__ == "__main__":
    sys.exit(main())
