"""Spark across broker groups (tracker issue 31, item 8): `bench/spark_bench.py --groups 1,2`.

In one run, on one Spark session (`local[2]`): the same 1,000,000-row DataFrame written as Parquet on
local disk, then through format("txbroker") to a cluster of 1 broker group, then of 2 (fresh clusters:
`txbroker broker --group gI --cluster-file route.json`, one master per group, no slaves; the
1-group case is a route of one group, so both take the same code path). Each write is one broker job
(the driver's generated name puts its home on either group), keyed by order id, 1000 rows per
member transaction, row-as-JSON bodies.

Broker CPU per message, split by phase. Every broker's CPU time (all its threads, and its event-loop
thread apart; /proc/<pid>/task/*/schedstat) is sampled: before the write, at the commit point, when
save() returns, and once more after a settle time. The commit point is the data source's own hook: the write runs with
`inject.hangAt=before-decision` and an `inject.markerFile`, whose `.release` file exists beforehand,
so the driver writes the marker as it reaches its decision and goes on at once (faults.py); a
thread here sees the marker within 2 ms and samples. So:

  send   write start -> commit point: the tasks' half messages (every member transaction stored)
  end    commit point -> save() returned: DECIDE_JOB at the home, the members ended on every group,
         with 2 groups the member group asking its home (QUERY_JOB_MEMBERS) and the home's release
         (QUERY_JOB to the member group, a release record: the home reports the job resolved only
         then), the driver's describes while it waits
  tail   the settle time after save(): background work (RocksDB flushes and compactions)

each net of the brokers' idle CPU (measured for 2 s before every write: ticks, metrics).

The per-job cost of spanning groups is measured apart, with the client library: `--span-jobs` small
jobs (two 1-message members each, on g0, the home) on the 1-group cluster, and the same on the
2-group cluster, where every job also spans g1 (an entry there, without members): the same messages
on the same group, so the difference per job is what a second group adds: on g1 the entry's
OPEN_JOB, the decision told to it, its QUERY_JOB_MEMBERS to the home and its decision record, the
home's QUERY_JOB; on g0 answering those and its release record. (With members on g1 too, each
QUERY_JOB_MEMBERS carries their ids: one request per 5000 of them; the members' own cost is per
message, c_msg.)

From both, the scaling model for 4/8/16 groups (a model, not a measurement; `model()` states its
assumptions), against the issue's goal of 0.8 x N one group's broker-side rate.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH / "broker")]

from common import CLK_TCK, host_speed_ms, machine_info, process_cpu, system_cpu  # noqa: E402  (bench/broker/)
from groups_bench import Cluster  # noqa: E402

GROUP = "bench-spark"
IDLE_SECONDS = 2.0
SETTLE_SECONDS = 2.5
MODEL_GROUPS = (4, 8, 16)
MODEL_JOB_ROWS = (1_000_000, 100_000, 10_000)


# ---- CPU, from /proc ------------------------------------------------------------------------------

def _run_ns(path: str) -> int:
    try:
        return int(open(path).read().split()[0])
    except (OSError, IndexError, ValueError):
        return 0


def broker_cpu(pid: int) -> float:
    """CPU seconds of every live thread of `pid`, in nanoseconds' resolution (schedstat; /proc/<pid>/stat
    counts 10 ms ticks, too coarse for a few hundred small jobs)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    return sum(_run_ns(f"/proc/{pid}/task/{t}/schedstat") for t in tids) / 1e9


def loop_cpu(pid: int) -> float:
    """CPU seconds of `pid`'s main thread: the broker's event loop."""
    return _run_ns(f"/proc/{pid}/task/{pid}/schedstat") / 1e9

def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _tree_cpu(root: int, skip: set[int]) -> float:
    """CPU seconds of `root`'s descendants (not `root`; not `skip` nor theirs), reaped children included."""
    kids, total = _children(), 0.0
    todo = list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in skip:
            continue
        try:
            rest = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in rest[11:15]) / CLK_TCK  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            pass
        todo += kids.get(pid, [])
    return total


class Snapshot:
    """Every broker's CPU (process and event-loop thread), Spark's (this process's other descendants:
    the JVM and its Python workers), this process's own, and the machine's."""

    def __init__(self, brokers: dict[str, int], with_spark: bool = True):
        self.t = time.monotonic()
        self.proc = {n: broker_cpu(p) for n, p in brokers.items()}
        self.loop = {n: loop_cpu(p) for n, p in brokers.items()}
        self.spark = _tree_cpu(os.getpid(), set(brokers.values())) if with_spark else None
        self.own = process_cpu(os.getpid())
        self.busy, self.total, _steal = system_cpu()

    def since(self, a: "Snapshot", idle: dict[str, float] | None = None) -> dict:
        """CPU seconds between `a` and this one; brokers' net of `idle` (CPU seconds per second)."""
        dt = self.t - a.t
        idle = idle or {}
        proc = {n: self.proc[n] - a.proc[n] - idle.get(n, 0.0) * dt for n in self.proc}
        loop = {n: self.loop[n] - a.loop[n] - idle.get(n + ":loop", 0.0) * dt for n in self.loop}
        busy = self.busy - a.busy
        spark = (self.spark - a.spark) if self.spark is not None and a.spark is not None else None
        brokers_raw = sum(self.proc[n] - a.proc[n] for n in self.proc)
        others = busy - brokers_raw - (spark or 0.0) - (self.own - a.own)
        return {"seconds": round(dt, 3), "brokers_cpu_s": {n: round(v, 4) for n, v in proc.items()},
                "brokers_loop_cpu_s": {n: round(v, 4) for n, v in loop.items()},
                "spark_cpu_s": round(spark, 3) if spark is not None else None,
                "machine_busy_cpu_s": round(busy, 3), "others_cpu_s": round(max(others, 0.0), 3)}


def idle_rates(brokers: dict[str, int], seconds: float = IDLE_SECONDS) -> dict[str, float]:
    """Each broker's CPU per second while nothing is sent (its ticks), process and loop thread."""
    a = Snapshot(brokers, with_spark=False)
    time.sleep(seconds)
    b = Snapshot(brokers, with_spark=False)
    dt = b.t - a.t
    out = {n: (b.proc[n] - a.proc[n]) / dt for n in brokers}
    out.update({n + ":loop": (b.loop[n] - a.loop[n]) / dt for n in brokers})
    return out


class CommitPointWatch:
    """Samples the brokers the moment the driver's marker file appears (the commit point)."""

    def __init__(self, marker: Path, brokers: dict[str, int]):
        self.marker, self.brokers = marker, brokers
        self.snapshot: Snapshot | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commit-point-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.marker.exists():
                self.snapshot = Snapshot(self.brokers)
                return
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


# ---- the brokers' admin API -------------------------------------------------------------------------

def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def visible(cluster: Cluster, topic: str) -> int:
    return sum(q["max_offset"] for m in cluster.masters
               for q in _get(f"{m.admin}/api/v1/topics/{topic}")["queues"])


def pending(cluster: Cluster) -> int:
    return sum(_get(f"{m.admin}/api/v1/transactions?group={GROUP}")["total"] for m in cluster.masters)


def newest_job(cluster: Cluster) -> dict:
    """The newest job of GROUP: its id, home (the group holding its decision), members per group."""
    out: dict = {"members": {}}
    for i, m in enumerate(cluster.masters):
        jobs = _get(f"{m.admin}/api/v1/jobs?group={GROUP}&limit=1")["jobs"]
        if not jobs:
            continue
        j = jobs[0]
        out["members"][f"g{i}"] = j["members"]
        if not j.get("home"):
            out.update(job_id=j["job_id"], home=f"g{i}", state=j["state"], resolved=j["resolved"])
    return out


# ---- one Spark write, measured by phase -----------------------------------------------------------

def publish(df, cluster: Cluster, topic: str, batch_size: int, marker: Path | None = None) -> None:
    w = (df.write.format("txbroker").option("brokers", cluster.bootstrap).option("topic", topic)
         .option("producerGroup", GROUP).option("keyColumn", "order_id").option("batchSize", batch_size))
    if marker is not None:  # the commit-point hook (faults.py): announce, then go on at once
        w = w.option("inject.hangAt", "before-decision").option("inject.markerFile", str(marker))
    w.mode("append").save()


def per_message(cpu_s: dict[str, float], rows: int) -> dict[str, float]:
    return {n: round(v / rows * 1e6, 3) for n, v in cpu_s.items()}


def measured_write(df, rows: int, cluster: Cluster, topic: str, batch_size: int, workdir: Path, tag: str) -> dict:
    brokers = {f"g{i}": m.pid for i, m in enumerate(cluster.masters)}
    marker = workdir / f"commit-point-{tag}.json"
    Path(str(marker) + ".release").write_text("")  # the hook returns at once
    load_before = os.getloadavg()
    idle = idle_rates(brokers)
    watch = CommitPointWatch(marker, brokers)
    s0 = Snapshot(brokers)
    t0 = time.perf_counter()
    try:
        publish(df, cluster, topic, batch_size, marker)
    finally:
        watch.stop()
    wall = time.perf_counter() - t0
    s_end = Snapshot(brokers)
    time.sleep(SETTLE_SECONDS)
    s_tail = Snapshot(brokers)
    load_after = os.getloadavg()
    s_dec = watch.snapshot
    if s_dec is None:
        raise RuntimeError(f"{tag}: the driver never reached its commit point (no {marker})")
    send, end, tail = s_dec.since(s0, idle), s_end.since(s_dec, idle), s_tail.since(s_end, idle)

    def us(phase: dict, key: str = "brokers_cpu_s") -> float:
        return round(sum(phase[key].values()) / rows * 1e6, 3)

    loop = "brokers_loop_cpu_s"
    return {
        "tag": tag, "groups": len(brokers), "rows": rows, "seconds": round(wall, 3),
        "rows_per_s": round(rows / wall), "send_seconds": send["seconds"], "end_seconds": end["seconds"],
        "broker_us_per_msg": {"send": us(send), "end": us(end), "tail": us(tail),
                              "send_end": round(us(send) + us(end), 3),
                              "total": round(us(send) + us(end) + us(tail), 3)},
        "broker_loop_us_per_msg": {"send": us(send, loop), "end": us(end, loop),
                                   "send_end": round(us(send, loop) + us(end, loop), 3)},
        "per_broker_us_per_msg": {"send": per_message(send["brokers_cpu_s"], rows),
                                  "end": per_message(end["brokers_cpu_s"], rows),
                                  "tail": per_message(tail["brokers_cpu_s"], rows)},
        "cpu": {"send": send, "end": end, "tail": tail},
        "spark_cores": {p: round(max(d["spark_cpu_s"], 0.0) / d["seconds"], 2)
                        for p, d in (("send", send), ("end", end))},
        "others_cores": {p: round(d["others_cpu_s"] / d["seconds"], 2) for p, d in (("send", send), ("end", end))},
        "idle_broker_cpu_per_s": {n: round(v, 4) for n, v in idle.items()},
        "job": newest_job(cluster), "commit_point_marker": json.loads(marker.read_text()),
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in load_after],
    }


# ---- the per-job cost of a second group, with the client library ----------------------------------

async def _span_jobs(bootstrap: str, jobs: int, concurrency: int, topic: str) -> dict:
    from txbroker.client import AsyncClusterJobCoordinator, Message  # noqa: PLC0415

    async with AsyncClusterJobCoordinator(GROUP, bootstrap, request_timeout=60) as c:
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int):
            async with sem:
                job = await c.open(600)  # unnamed: its home is g0; with 2 groups, an entry on g1
                ids = [await c.send(job, "g0", Message(topic, f"j{i}-m{k}".encode()), f"{job.job_id}-m{k}")
                       for k in range(2)]
                await c.commit(job, {"g0": ids})
                return job

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(jobs)))
        t_decided = time.perf_counter()
        left = list(done)
        while left:  # one describe per job per pass: the same few for 1 and 2 groups
            await asyncio.sleep(1.2)
            infos = await asyncio.gather(*(c.describe(j) for j in left))
            left = [j for j, info in zip(left, infos) if not info.resolved]
        return {"decided_seconds": round(t_decided - t0, 3), "resolved_seconds": round(time.perf_counter() - t0, 3)}


def span_cost(cluster: Cluster, jobs: int, concurrency: int) -> dict:
    brokers = {f"g{i}": m.pid for i, m in enumerate(cluster.masters)}
    load_before = os.getloadavg()
    idle = idle_rates(brokers)
    a = Snapshot(brokers, with_spark=False)
    timing = asyncio.run(_span_jobs(cluster.bootstrap, jobs, concurrency, "SpanCost"))
    time.sleep(SETTLE_SECONDS)  # the home's release comes at its next tick
    b = Snapshot(brokers, with_spark=False)
    d = b.since(a, idle)
    per_job = {n: round(v / jobs * 1e6, 1) for n, v in d["brokers_cpu_s"].items()}
    per_job_loop = {n: round(v / jobs * 1e6, 1) for n, v in d["brokers_loop_cpu_s"].items()}
    return {"groups": len(brokers), "jobs": jobs, "concurrency": concurrency, "members_per_job": 2,
            "messages_per_member": 1, "members_on": "g0 (the home)", **timing,
            "broker_us_per_job": round(sum(per_job.values()), 1),
            "broker_loop_us_per_job": round(sum(per_job_loop.values()), 1),
            "per_broker_us_per_job": per_job, "per_broker_loop_us_per_job": per_job_loop,
            "idle_broker_cpu_per_s": {n: round(v, 4) for n, v in idle.items()}, "cpu": d,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


# ---- the scaling model ------------------------------------------------------------------------------

def model(one: dict, two: dict, span1: dict, span2: dict) -> dict:
    """N groups' broker-side rate from the measured costs (a model, not a measurement).

    c_msg: one group's broker CPU per message of a write (send + end, all threads; the loop thread
    apart as the tighter bound), c_job: one group's fixed cost per job, c_span: what each further
    group adds per job (split home / member). One job of M messages on N groups, each group's
    master on a core of its own:
      many jobs, homes spread    rate_N = N * M / (M * c_msg + c_job + (N - 1) * c_span)
      one job at a time          the home is the slowest group: M / (M / N * c_msg + c_job + (N - 1) * c_span_home)
    against one group's rate_1 = M / (M * c_msg + c_job); goal: rate_N >= 0.8 * N * rate_1. The
    "as measured with 2 groups" column takes each group's c_msg from the 2-group run instead (what a
    group spent per message of its share): the measured drift, carried to N groups.
    """
    c_msg = one["broker_us_per_msg"]["send_end"]
    c_msg_loop = one["broker_loop_us_per_msg"]["send_end"]
    c_msg_2 = two["broker_us_per_msg"]["send_end"]
    c_job = span1["broker_us_per_job"]
    c_span = max(span2["broker_us_per_job"] - span1["broker_us_per_job"], 0.0)
    c_span_home = max(span2["per_broker_us_per_job"]["g0"] - span1["per_broker_us_per_job"]["g0"], 0.0)
    c_span_loop = max(span2["broker_loop_us_per_job"] - span1["broker_loop_us_per_job"], 0.0)
    rows = []
    for m in MODEL_JOB_ROWS:
        r1 = m / (m * c_msg + c_job) * 1e6
        c_job_loop = span1["broker_loop_us_per_job"]
        r1_loop = m / (m * c_msg_loop + c_job_loop) * 1e6
        for n in MODEL_GROUPS:
            spread = n * m / (m * c_msg + c_job + (n - 1) * c_span) * 1e6
            spread_2 = n * m / (m * c_msg_2 + c_job + (n - 1) * c_span) * 1e6
            single = m / (m / n * c_msg + c_job + (n - 1) * c_span_home) * 1e6
            spread_loop = n * m / (m * c_msg_loop + c_job_loop + (n - 1) * c_span_loop) * 1e6
            rows.append({"groups": n, "job_rows": m, "one_group_msgs_per_s": round(r1),
                         "msgs_per_s_spread": round(spread), "ratio_spread": round(spread / (n * r1), 4),
                         "msgs_per_s_c_msg_of_2_groups": round(spread_2),
                         "ratio_c_msg_of_2_groups": round(spread_2 / (n * r1), 4),
                         "msgs_per_s_one_job": round(single), "ratio_one_job": round(single / (n * r1), 4),
                         "msgs_per_s_loop_bound": round(spread_loop),
                         "ratio_loop_bound": round(spread_loop / (n * r1_loop), 4),
                         "goal_0_8_n_msgs_per_s": round(0.8 * n * r1)})
    # the smallest job for which 0.8 * N holds with homes spread: (N-1) c_span <= 0.25 (M c_msg + c_job)
    min_rows = {n: max(0, round((4 * (n - 1) * c_span - c_job) / c_msg)) if c_msg else None for n in MODEL_GROUPS}
    return {
        "c_msg_us": c_msg, "c_msg_loop_us": c_msg_loop, "c_msg_two_groups_us": c_msg_2,
        "c_job_us": c_job, "c_span_us": round(c_span, 1), "c_span_home_us": round(c_span_home, 1),
        "c_span_loop_us": round(c_span_loop, 1), "one_group_broker_side_msgs_per_s": round(1e6 / c_msg),
        "smallest_job_rows_for_goal": min_rows, "rows": rows,
        "assumptions": [
            "each group's master has a core of its own for everything its process does (event loop, RocksDB "
            "threads); Spark's executors, the driver and any slaves on other cores or machines",
            "a group's broker CPU per message (c_msg, send + end, measured with ONE group) does not depend on how "
            "many groups there are: the same work per message, just on another group",
            "the only cost that grows with the groups is per job: c_span per further group (the entry, the decision "
            "told, QUERY_JOB_MEMBERS, QUERY_JOB and the release), measured with the client library",
            "rows spread evenly over the groups (keyColumn's crc32 does; so does the even placement)",
            "no other limit: the network, Spark's own rate and the driver are taken to keep up",
        ],
    }


def model_lines(mod: dict) -> list[str]:
    out = [f"c_msg {mod['c_msg_us']:.2f} us/msg (loop {mod['c_msg_loop_us']:.2f}; measured with 2 groups: "
           f"{mod['c_msg_two_groups_us']:.2f}), c_job {mod['c_job_us']:.0f} us, c_span {mod['c_span_us']:.0f} us per "
           f"further group per job (at the home {mod['c_span_home_us']:.0f}); one group: "
           f"{mod['one_group_broker_side_msgs_per_s']:,} msgs/s per core of broker",
           "| groups | rows per job | model msgs/s, homes spread (x N*one) | c_msg as measured with 2 groups (x) | "
           "one job at a time (x) | loop-bound (x) | 0.8 x N x one group |", "|---|---|---|---|---|---|---|"]
    for r in mod["rows"]:
        out.append(f"| {r['groups']} | {r['job_rows']:,} | {r['msgs_per_s_spread']:,} ({r['ratio_spread']:.3f}) | "
                   f"{r['msgs_per_s_c_msg_of_2_groups']:,} ({r['ratio_c_msg_of_2_groups']:.3f}) | "
                   f"{r['msgs_per_s_one_job']:,} ({r['ratio_one_job']:.3f}) | {r['msgs_per_s_loop_bound']:,} "
                   f"({r['ratio_loop_bound']:.3f}) | {r['goal_0_8_n_msgs_per_s']:,} |")
    out.append("smallest job (rows) for 0.8 x N with homes spread: " + ", ".join(
        f"{n} groups: {v:,}" for n, v in mod["smallest_job_rows_for_goal"].items()))
    return out


# ---- the mode ---------------------------------------------------------------------------------------

def run(args, frame) -> int:
    os.environ.setdefault("TXBROKER_SPARK_LOG", "ERROR")  # the hook's warnings would print every run
    from txbroker_spark import local_session  # noqa: PLC0415

    groups = [int(g) for g in args.groups.split(",")]
    command = " ".join([Path(sys.executable).relative_to(Path.cwd()).as_posix()
                        if Path(sys.executable).is_relative_to(Path.cwd()) else sys.executable, *sys.argv])
    workdir = Path(tempfile.mkdtemp(prefix="txbroker-spark-groups-"))
    results: dict = {"what": "Spark batch write across broker groups (issue 31, item 8)", "command": command,
                     "rows": args.rows, "partitions": args.partitions, "batch_size": args.batch_size,
                     "master": args.master, "flush": args.flush, "repeat": args.repeat,
                     "machine": machine_info(), "host_speed_ms_before": host_speed_ms(),
                     "loadavg_start": [round(x, 2) for x in os.getloadavg()], "cases": {}, "span_cost": {}}
    spark = local_session("txbroker-spark-groups-bench", args.master, conf={"spark.driver.memory": "2g"},
                          log_level="ERROR")
    results["machine"]["packages"]["pyspark"] = spark.version
    results["python"] = platform.python_version()
    started = time.monotonic()
    try:
        df = frame(spark, args.rows, args.partitions)
        warm = frame(spark, 20_000, args.partitions)
        print(f"[bench] {args.rows:,} rows, {args.partitions} partitions, {args.master}, groups {groups}, "
              f"{args.flush} flush; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus", flush=True)

        warm.write.mode("overwrite").parquet(str(workdir / "warm.parquet"))
        runs = []
        for r in range(args.repeat):
            lb = os.getloadavg()
            t0 = time.perf_counter()
            df.write.mode("overwrite").parquet(str(workdir / "out.parquet"))
            secs = time.perf_counter() - t0
            runs.append({"seconds": round(secs, 3), "rows_per_s": round(args.rows / secs),
                         "loadavg_before": [round(x, 2) for x in lb],
                         "loadavg_after": [round(x, 2) for x in os.getloadavg()]})
            print(f"[bench] parquet, run {r + 1}: {secs:6.2f} s {args.rows / secs:>11,.0f} rows/s  (load "
                  f"{lb[0]:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
        results["cases"]["parquet"] = {"runs": runs, "best": min(runs, key=lambda x: x["seconds"])}

        for n in groups:
            cluster = Cluster(n, flush=args.flush).start()
            try:
                publish(warm, cluster, "Warmup", args.batch_size)
                topic, runs = f"SparkG{n}", []
                for r in range(args.repeat):
                    res = measured_write(df, args.rows, cluster, topic, args.batch_size, workdir, f"g{n}-r{r}")
                    runs.append(res)
                    b = res["broker_us_per_msg"]
                    print(f"[bench] txbroker, {n} group(s), run {r + 1}: {res['seconds']:6.2f} s "
                          f"{res['rows_per_s']:>11,} rows/s (send {res['send_seconds']:.2f} s, end "
                          f"{res['end_seconds']:.2f} s); broker us/msg send {b['send']:.2f} + end {b['end']:.2f}"
                          f" (+ tail {b['tail']:.2f}); home {res['job'].get('home')}; spark "
                          f"{res['spark_cores']['send']:.2f} cores, others {res['others_cores']['send']:.2f} "
                          f"while sending (load {res['loadavg_before'][0]:.1f} -> {res['loadavg_after'][0]:.1f})",
                          flush=True)
                seen, left = visible(cluster, topic), pending(cluster)
                span = span_cost(cluster, args.span_jobs, args.span_concurrency) if args.span_jobs else None
                print(f"[bench] {n} group(s): visible {seen:,} (expected {args.rows * args.repeat:,}), pending {left}"
                      + (f"; {args.span_jobs} small jobs: {span['broker_us_per_job']:.0f} us of broker CPU per job "
                         f"({', '.join(f'{g} {v:.0f}' for g, v in span['per_broker_us_per_job'].items())}; loop "
                         f"{span['broker_loop_us_per_job']:.0f})" if span else ""), flush=True)
                results["cases"][f"groups_{n}"] = {
                    "cluster": cluster.describe(), "runs": runs,
                    "best": min(runs, key=lambda x: x["seconds"]),
                    "cheapest": min(runs, key=lambda x: x["broker_us_per_msg"]["send_end"]),
                    "visible": seen, "pending_after": left}
                results["span_cost"][f"groups_{n}"] = span
                if seen != args.rows * args.repeat or left:
                    results["error"] = f"{n} groups: {seen} visible, {left} pending"
                    print(f"[bench] ERROR: {results['error']}", flush=True)
            finally:
                cluster.stop()
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    if {"groups_1", "groups_2"} <= set(results["cases"]) and args.span_jobs:  # (the model needs the span cost)
        g1, g2 = results["cases"]["groups_1"], results["cases"]["groups_2"]
        results["model"] = model(g1["cheapest"], g2["cheapest"], results["span_cost"]["groups_1"],
                                 results["span_cost"]["groups_2"])
        results["measured_ratio_2_groups"] = {
            "rows_per_s": round(g2["best"]["rows_per_s"] / g1["best"]["rows_per_s"], 3),
            "broker_side": round(g1["cheapest"]["broker_us_per_msg"]["send_end"]
                                 / g2["cheapest"]["broker_us_per_msg"]["send_end"], 3)}
        print("[bench] model (not a measurement):", flush=True)
        for line in model_lines(results["model"]):
            print("  " + line, flush=True)
    results["host_speed_ms_after"] = host_speed_ms()
    results["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results["minutes"] = round((time.monotonic() - started) / 60, 1)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out_dir = BENCH / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = Path(args.output) if args.output else out_dir / f"spark-groups-{time.strftime('%Y%m%d-%H%M%S')}.json"
    text = json.dumps(results, indent=2) + "\n"
    out.write_text(text)
    if not args.output:
        (out_dir / "spark-groups-latest.json").write_text(text)
    print(f"[bench] {results['minutes']} min; load average now {results['loadavg_end'][0]:.1f}; results in {out}",
          flush=True)
    return 1 if "error" in results else 0
