#!/usr/bin/env python3
"""Where a Spark write's time goes: the task's own Python per row, what Spark costs before any of
ours runs, and each process's share of a whole write.

    .venv/bin/python bench/spark_task_cost.py task [--rows 500000] [--profile]
    .venv/bin/python bench/spark_task_cost.py floor [--repeat 3]
    .venv/bin/python bench/spark_task_cost.py split [--repeat 3]

`task`: one task attempt's Python path alone (txbroker_spark's DataWriter.write_arrow: Arrow batches
to messages, placed by key, into 1,000-row transactions joining a broker job, sent by the client on
its background loop) against a local broker process, with Arrow batches of 10,000 rows shaped like
bench/spark_bench.py's frame (id, order id, customer, amount, UTC timestamp; keyed by order id). No
Spark: prints the CPU per row of the task's two threads (the task's and the client's loop), and
with --profile the task thread's cProfile (the loop thread is not in it).

`floor`: bench/spark_bench.py's 1M-row frame written from local[2] to a Python data source whose
writer only counts the Arrow rows it is given, beside the same frame to Parquet: what Spark takes to
make the rows and hand them to Python, which no change of ours makes shorter.

`split`: bench/spark_bench.py's 1M-row write to a local broker (ASYNC flush), with each process's
CPU over the write (its half messages and the job's decision; not the wait until the members are
visible): Spark's JVM, its Python workers (ours and PySpark's reading of the Arrow stream), the
broker.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "broker_image"))
sys.path.insert(0, str(ROOT / "spark"))
sys.path.insert(0, str(ROOT / "bench"))


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far (scheduler stats)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        out[tid] = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9
    return out


def task(args) -> None:
    import pyarrow as pa
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType, TimestampType

    from txbroker_spark.cluster import learn_route
    from txbroker_spark.commit import jobs_for
    from txbroker_spark.data_writer import DataWriter, TaskAttempt
    from txbroker_spark.options import P_JOB, P_KIND, parse_write_options

    from spark_bench import Broker

    workdir = Path(tempfile.mkdtemp(prefix="txbroker-task-cost-"))
    broker = Broker(workdir, "ASYNC")
    try:
        arrow_schema = pa.schema([("id", pa.int64()), ("order_id", pa.string()), ("customer_id", pa.string()),
                                  ("amount", pa.float64()), ("created_at", pa.timestamp("us", tz="UTC"))])
        spark_schema = StructType([StructField("id", LongType()), StructField("order_id", StringType()),
                                   StructField("customer_id", StringType()), StructField("amount", DoubleType()),
                                   StructField("created_at", TimestampType())])

        def batch(start: int, n: int):
            ids = range(start, start + n)
            return pa.RecordBatch.from_arrays([
                pa.array(ids, pa.int64()), pa.array([f"o-{i:09d}" for i in ids]),
                pa.array([f"c-{i % 50000:05d}" for i in ids]), pa.array([(i % 100000) / 100.0 for i in ids]),
                pa.array([(1767225600 + i) * 1_000_000 for i in ids], pa.timestamp("us", tz="UTC"))],
                schema=arrow_schema)

        batches = [batch(s, min(10_000, args.rows - s)) for s in range(0, args.rows, 10_000)]
        o = parse_write_options({"brokers": broker.address, "topic": "Bench", "producerGroup": "bench",
                                 "keyColumn": "order_id", "batchSize": "1000"}, spark_schema, streaming=False)
        route = learn_route(o.brokers, o.topic, o.security, o.request_timeout)
        with jobs_for(o) as jobs:
            job = jobs.open(f"task-cost-{os.getpid()}", 600)

        def attempt(part: int, rows) -> None:
            writer = DataWriter(o, job.job_id, TaskAttempt(part, 0, part), {P_KIND: "batch", P_JOB: job.job_id},
                                lambda g, n, msgs: f"{job.job_id}-p{part}-{g}-c{n}", "task cost",
                                route.only(job.all_groups))
            writer.run(lambda w: w.write_arrow(iter(rows)))

        attempt(99, batches[:2])  # warm: connections, imports
        profile = cProfile.Profile() if args.profile else None
        before, t0 = _thread_cpu(), time.perf_counter()
        if profile:
            profile.enable()
        attempt(1, batches)
        if profile:
            profile.disable()
        wall, after = time.perf_counter() - t0, _thread_cpu()
        main = str(os.getpid())
        spent = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}
        task_us = spent.get(main, 0.0) / args.rows * 1e6
        loop_us = sum(v for tid, v in spent.items() if tid != main) / args.rows * 1e6
        print(f"[task] {args.rows:,} rows in {wall:.2f} s: CPU per row {task_us + loop_us:.2f} us "
              f"(task thread {task_us:.2f}, client loop {loop_us:.2f})")
        if profile:
            pstats.Stats(profile).sort_stats("tottime").print_stats(20)
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def floor(args) -> None:
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    from spark_bench import frame
    from txbroker_spark import local_session

    class CountingWriter(DataSourceArrowWriter):
        def write(self, iterator):
            for _batch in iterator:
                pass
            return WriterCommitMessage()

    class Counting(DataSource):
        @classmethod
        def name(cls):
            return "counting"

        def writer(self, schema, overwrite):
            return CountingWriter()

    spark = local_session("txbroker-spark-floor", "local[2]", conf={"spark.driver.memory": "2g"}, log_level="ERROR")
    spark.dataSource.register(Counting)
    df = frame(spark, 1_000_000, 4)
    workdir = Path(tempfile.mkdtemp(prefix="txbroker-spark-floor-"))
    try:
        for run in range(1, args.repeat + 1):
            t0 = time.perf_counter()
            df.write.format("counting").mode("append").save()
            counted = time.perf_counter() - t0
            t0 = time.perf_counter()
            df.write.mode("overwrite").parquet(str(workdir / "out.parquet"))
            parquet = time.perf_counter() - t0
            print(f"[floor] run {run}: rows handed to a Python writer that counts them {counted:.2f} s, "
                  f"Parquet {parquet:.2f} s", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _process_cpu() -> dict[str, float]:
    """CPU seconds so far of this machine's Spark JVMs, PySpark workers and txbroker brokers, by kind."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        line = b" ".join(cmd)
        if cmd[0].endswith(b"java"):
            kind = "Spark JVM"
        elif b"pyspark" in line and (b"daemon" in line or b"worker" in line):
            kind = "Python workers"
        elif b"broker" in cmd[1:3] and any(c.endswith(b"txbroker") for c in cmd[:2]):
            kind = "broker"
        else:
            continue
        out[kind] = out.get(kind, 0.0) + (int(stat[11]) + int(stat[12])) / tick
    return out


def split(args) -> None:
    from spark_bench import Broker, frame, publish
    from txbroker_spark import local_session

    os.environ.setdefault("TXBROKER_SPARK_LOG", "WARNING")
    workdir = Path(tempfile.mkdtemp(prefix="txbroker-spark-split-"))
    spark = local_session("txbroker-spark-split", "local[2]", conf={"spark.driver.memory": "2g"}, log_level="ERROR")
    broker = Broker(workdir, "ASYNC")
    try:
        df = frame(spark, 1_000_000, 4)
        publish(frame(spark, 20_000, 4), broker, "Warmup", 1000)
        for run in range(1, args.repeat + 1):
            before, t0 = _process_cpu(), time.perf_counter()
            publish(df, broker, f"Split{run}", 1000)
            wall, after = time.perf_counter() - t0, _process_cpu()
            cpu = {k: v - before.get(k, 0.0) for k, v in after.items()}
            print(f"[split] run {run}: the write {wall:.2f} s; CPU " + ", ".join(
                f"{k} {v:.2f} s" for k, v in sorted(cpu.items())) + f"; all {sum(cpu.values()):.2f} s of "
                f"{os.cpu_count() * wall:.2f} on {os.cpu_count()} cores", flush=True)
    finally:
        broker.stop()
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("task", help="the task's Python path alone against a local broker: CPU per row")
    t.add_argument("--rows", type=int, default=500_000)
    t.add_argument("--profile", action="store_true", help="and the task thread's cProfile")
    f = sub.add_parser("floor", help="Spark handing the bench's rows to a Python writer that counts them")
    f.add_argument("--repeat", type=int, default=3)
    s = sub.add_parser("split", help="a 1M-row write to a local broker: each process's CPU over it")
    s.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    {"task": task, "floor": floor, "split": split}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
