#!/usr/bin/env python3
"""Orders job: write a result dataset and publish one event per order, tied to that write.

RocketMQ's transactional pattern with Spark in the middle:

  1. the events go out as half messages joining one broker job (`format("txbroker")`,
     commit=deferred): stored, invisible; the job's member list (the exact transactions of the task
     attempts Spark kept) is fixed on the broker;
  2. the local transaction: the result dataset is written as Parquet to OUTPUT/_staging/<job>;
  3. the commit point: the job's COMMIT decision, one record in the broker's replicated log;
  4. the dataset is moved to OUTPUT/job=<job>; the broker has made the events visible meanwhile.

A crash before 3 leaves neither: the broker aborts the job at its deadline (or the next run aborts
it at once) and the next run deletes the staging directory. A crash after 3 leaves both: the broker
publishes the events from the decision, the next run finishes the move (`recover`). Transactions of
task attempts Spark discarded (a failed or speculative attempt) are not in the decision: the broker
rolls them back when it records it.

    python spark/jobs/orders_job.py --brokers 127.0.0.1:10911 --group orders-publisher \
        --input /tmp/orders --output /tmp/orders-result [--fail-partition 1]

Also runs under spark-submit (the master then comes from spark-submit unless --master is given).
A broker that requires credentials or TLS: --access-key with --secret-key-file, --tls-ca (and
--tls-cert/--tls-key, --tls-server-name), or the same from the environment (TXBROKER_ACCESS_KEY,
TXBROKER_SECRET_KEY_FILE, TXBROKER_TLS_CA, ...), as the data source reads them (txbroker_spark/security.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from txbroker.client.admin import AdminClient

log = logging.getLogger("orders_job")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[2,4])")
    p.add_argument("--brokers", required=True, help="HOST:PORT[,HOST:PORT...]")
    p.add_argument("--topic", default="OrderEvents")
    p.add_argument("--group", default="orders-publisher", help="producer group of the job")
    p.add_argument("--input", required=True, help="orders dataset (Parquet); generated if missing")
    p.add_argument("--output", required=True, help="result dataset root (Parquet, one job=<id> directory per run)")
    p.add_argument("--orders", type=int, default=10_000, help="orders to generate when the input is missing")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the publishing stage")
    p.add_argument("--batch-size", type=int, default=500, help="events per transaction")
    p.add_argument("--deadline-seconds", type=float, default=600.0,
                   help="the broker aborts the job if it is still undecided this long after it started (once "
                        "prepared, this long after the prepare: this job decides right after its dataset is written)")
    p.add_argument("--fail-partition", type=int, default=None,
                   help="inject a failure: the first attempt of this partition fails after sending its half messages")
    p.add_argument("--fail-mode", choices=["crash", "raise"], default="crash",
                   help="crash: its Python worker dies (nothing cleans up); raise: the task raises")
    p.add_argument("--inject-crash", choices=["after-dataset", "after-decision"], default=None,
                   help="inject a failure (tests): the driver exits at once after writing the dataset (before the "
                        "decision) or after recording the decision (before the move and the ENDs)")
    p.add_argument("--inject-hang", choices=["after-decision"], default=None,
                   help="inject a failure (tests): after recording the decision the driver waits to be killed (its "
                        "pod deleted, say), at most 10 minutes")
    p.add_argument("--progress-seconds", type=float, default=10.0,
                   help="log the running stage's progress this often (0: only when it ends)")
    p.add_argument("--admin-url", default=None,
                   help="broker admin URL: count the discarded attempts' transactions the broker rolled back "
                        "(without it, rolled_back is unknown when Spark discarded task attempts); asked with "
                        "the credentials and TLS settings below, which need the admin permission there")
    p.add_argument("--settle-seconds", type=float, default=120.0, help="how long to wait for that")
    p.add_argument("--summary-json", default=None, help="also write the summary here")
    p.add_argument("--log-level", default="INFO")
    from txbroker_spark.security import add_arguments

    add_arguments(p)
    return p.parse_args(argv)


def recover(output: Path, job_for) -> None:
    """Finish or clean up earlier runs: a staging dataset whose job was committed is moved into
    place; one whose job was aborted (or never opened) is deleted; one still undecided is left
    alone (its run may still be at work; if its driver is gone, the broker aborts the job at its
    deadline and a later run deletes it). `job_for(name)` is a DeferredJob."""
    staging = output / "_staging"
    if not staging.is_dir():
        return
    for d in sorted(staging.iterdir()):
        if not d.is_dir():
            continue
        job = job_for(d.name)
        try:
            state = job.state()
        finally:
            job.close()
        if state in ("OPEN", "PREPARED"):
            log.info("job %s is still %s: left alone", d.name, state)
        elif state == "COMMITTED":
            final = output / f"job={d.name}"
            if not final.exists():
                os.replace(d, final)
                log.warning("recovered job %s: decided COMMITTED, dataset moved to %s", d.name, final)
        else:
            shutil.rmtree(d, ignore_errors=True)
            log.warning("cleaned up job %s: %s, staging dataset deleted", d.name, state)


def ensure_input(path: Path, n: int) -> None:
    """Generate N orders (deterministic) as Parquet with pyarrow, unless the input exists."""
    import datetime as dt
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.is_dir() and any(path.glob("*.parquet")):
        return
    t0 = time.monotonic()
    ids = range(n)
    epoch = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    table = pa.table({
        "order_id": [f"o-{i:08d}" for i in ids],
        "customer_id": [f"c-{(i * 7919) % 5000:05d}" for i in ids],
        "sku": [f"sku-{(i * 31) % 250:03d}" for i in ids],
        "quantity": pa.array([i % 5 + 1 for i in ids], pa.int32()),
        "unit_price": pa.array([decimal.Decimal((i * 37) % 9000 + 100) / 100 for i in ids], pa.decimal128(10, 2)),
        "created_at": pa.array([epoch + dt.timedelta(minutes=i) for i in ids], pa.timestamp("us", tz="UTC")),
    })
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    half = (n + 1) // 2
    pq.write_table(table.slice(0, half), tmp / "part-0.parquet")
    pq.write_table(table.slice(half), tmp / "part-1.parquet")
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    log.info("generated %d orders in %s (%.1fs)", n, path, time.monotonic() - t0)


def pending_of(admin: AdminClient, group: str, prefix: str) -> list[str]:
    listed = admin.transactions(group=group, limit=100000)
    return [t.transaction_id for t in listed.transactions if t.transaction_id.startswith(prefix)]


def settle(admin: AdminClient, group: str, job: str, discarded: list[str], timeout: float) -> dict:
    """Wait until the discarded attempts' half transactions are ended (the broker does it when it
    records the decision); report how they ended."""
    prefix = f"{job}-"
    deadline = time.monotonic() + timeout
    waiting = set(discarded)
    while waiting and time.monotonic() < deadline:
        waiting &= set(pending_of(admin, group, prefix))
        if waiting:
            time.sleep(0.2)
    states = {t: admin.transaction(t) for t in discarded}
    rolled_back = [t for t, s in states.items() if s.state == "ROLLED_BACK"]
    return {"discarded": discarded, "rolled_back": rolled_back, "still_pending": sorted(waiting),
            "by": {t: s.by for t, s in states.items()}}


def _crash(args, where: str) -> None:
    """Failure injection: die here as a lost driver would (its JVM exits when its stdin closes)."""
    if args.inject_crash == where:
        log.warning("inject-crash=%s: the driver exits now", where)
        logging.shutdown()
        os._exit(17)


def _hang(args, where: str) -> None:
    """Failure injection: wait here to be killed from outside (the driver's pod deleted)."""
    if args.inject_hang == where:
        log.warning("inject-hang=%s: the driver waits here to be killed", where)
        for handler in logging.getLogger().handlers:
            handler.flush()
        time.sleep(600)
        log.error("inject-hang=%s: nobody killed this driver within 10 minutes: it exits", where)
        logging.shutdown()
        os._exit(17)


def _cause(e: Exception) -> str:
    """The first telling line of an error (a Py4J error starts with "An error occurred while calling ...")."""
    lines = [ln.strip(" :\t") for ln in str(e).splitlines()]
    useful = [ln for ln in lines if ln and not ln.startswith("An error occurred while calling")]
    return (useful or [type(e).__name__])[0][:300]


def _discarded(progress, speculation: bool) -> tuple[int, bool]:
    """(task attempts Spark is known to have discarded, whether it may have discarded others): a
    failed attempt, a stage run again, or a speculative copy, whose half transactions the broker rolls
    back with the decision without this job hearing of it."""
    final = progress.final
    return final.failed, bool(final.failed or final.stage_retries or speculation)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stdout,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from txbroker_spark import DeferredJob, JobAborted, local_session, new_job_id, register
    from txbroker_spark.options import OptionError
    from txbroker_spark.progress import StageProgress
    from txbroker_spark.security import flag_message, from_args, options_from_args

    try:  # the flags, else the environment: the same settings the data source resolves from its options
        security = from_args(args)
    except OptionError as e:
        print(f"orders_job: {flag_message(e)}", file=sys.stderr)
        return 2
    # the broker's admin API, with the same credentials and TLS as the data plane
    admin = AdminClient(args.admin_url, **security.client_kwargs()) if args.admin_url else None
    t_start = time.monotonic()
    output, inp = Path(args.output).absolute(), Path(args.input).absolute()

    def job_for(name: str) -> DeferredJob:
        return DeferredJob(args.brokers, args.group, name, security=security)

    recover(output, job_for)

    if args.master or "PYSPARK_GATEWAY_PORT" not in os.environ:
        spark = local_session("orders-job", args.master or "local[2,4]", log_level="ERROR")
    else:  # under spark-submit: use its master and settings
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName("orders-job").getOrCreate()
        register(spark)
    log.info("spark %s, master %s", spark.version, spark.sparkContext.master)

    from pyspark.sql import functions as F

    ensure_input(inp, args.orders)
    orders = spark.read.parquet(str(inp))
    total = (F.col("quantity") * F.col("unit_price") * F.lit(1.08)).cast("decimal(12,2)")
    result = (orders.withColumn("total", total)
              .withColumn("status", F.when(total >= 500, "large").otherwise("standard")))
    job = new_job_id("orders-")
    staging = output / "_staging" / job
    final = output / f"job={job}"
    # rolled_back: None (unknown) until the job can count it; discarded_attempts: task attempts Spark
    # threw away (the broker rolls their half transactions back when the decision is recorded).
    summary = {"job": job, "job_id": None, "rows": 0, "transactions": 0, "committed": 0, "rolled_back": None,
               "discarded_attempts": 0, "seconds": 0.0,
               "decision": None, "dataset": str(final), "topic": args.topic, "group": args.group}

    events = (result.select("order_id", "customer_id", "total", "status", F.lit(job).alias("job"))
              .repartition(args.partitions, "order_id"))
    writer = (events.write.format("txbroker")
              .option("brokers", args.brokers).option("topic", args.topic).option("producerGroup", args.group)
              .option("jobId", job).option("commit", "deferred")
              .option("keyColumn", "order_id").option("tagsColumn", "status")
              .option("batchSize", args.batch_size).option("deadlineSeconds", args.deadline_seconds)
              .option("preparedDeadlineSeconds", args.deadline_seconds)
              .options(**options_from_args(args)))  # credentials and TLS flags; absent: the environment
    if args.fail_partition is not None:
        writer = writer.option("inject.failPartition", args.fail_partition).option("inject.failMode", args.fail_mode)
        log.info("injecting a failure: the first attempt of partition %d fails (%s) after sending its half messages",
                 args.fail_partition, args.fail_mode)
    deferred = job_for(job)
    discarded: list[str] = []
    stored: list[str] | None = None  # with --admin-url: every half transaction the write stored
    sc = spark.sparkContext
    speculation = sc.getConf().get("spark.speculation", "false").lower() == "true"
    sending = StageProgress(sc, f"{job}-send", f"job {job}: 1/4 sending", log.info, args.progress_seconds)
    maybe_discarded = True  # until the sending stage's counts say otherwise
    summary["rows"] = orders.count()  # one event per order
    try:
        t0 = time.monotonic()
        log.info("job %s: 1/4 sending one event per order as half messages to %s", job, args.topic)
        try:
            with sending:
                writer.mode("append").save()
        finally:
            summary["discarded_attempts"], maybe_discarded = _discarded(sending, speculation)
        prepared = deferred.prepared()
        summary["job_id"], summary["transactions"] = prepared.job_id, prepared.members
        log.info("job %s: %d events stored invisibly in %d transactions of broker job %s (%.1fs)", job,
                 summary["rows"], summary["transactions"], prepared.job_id, time.monotonic() - t0)
        if admin is not None:  # before the decision nothing of this job can have been ended yet
            kept = set(admin.job(prepared.job_id).member_ids)
            stored = pending_of(admin, args.group, f"{prepared.job_id}-")
            discarded = [t for t in stored if t not in kept]
            if discarded:
                log.info("job %s: %d half transactions of discarded task attempts are not in the decision: %s", job,
                         len(discarded), ", ".join(discarded[:6]) + (" ..." if len(discarded) > 6 else ""))
        t0 = time.monotonic()
        log.info("job %s: 2/4 local transaction: writing the result dataset to %s", job, staging)
        with StageProgress(sc, f"{job}-dataset", f"job {job}: 2/4 writing the dataset", log.info,
                           args.progress_seconds):
            result.write.mode("errorifexists").parquet(str(staging))
        log.info("job %s: dataset written (%.1fs)", job, time.monotonic() - t0)
        _crash(args, "after-dataset")
        log.info("job %s: 3/4 commit point: the job's COMMIT decision on the broker", job)
        deferred.commit()
        _crash(args, "after-decision")
        _hang(args, "after-decision")
    except JobAborted as e:  # the broker decided first (the deadline): it rolls back every event
        log.error("job %s: %s", job, e)
        shutil.rmtree(staging, ignore_errors=True)
        summary["decision"] = "ABORTED"
        _rolled_back(args, admin, summary, stored, summary["transactions"] if not maybe_discarded else None)
        return _finish(args, summary, t_start, 2)
    except Exception as e:  # noqa: BLE001 - anything before the decision aborts the job
        log.error("job %s failed before its decision (%s): aborting", job, _cause(e))
        info = deferred.abort()
        shutil.rmtree(staging, ignore_errors=True)
        summary["decision"] = "ABORTED"
        if info is not None and info.state == "COMMITTED":  # pragma: no cover - only this process commits
            raise
        if summary["transactions"] == 0:  # the write itself failed: the data source aborted the job
            log.info("job %s: the broker rolls back every half transaction the write stored", job)
            return _finish(args, summary, t_start, 1)
        log.info("job %s: ABORTED; the broker rolls back its %d transactions", job, summary["transactions"])
        _rolled_back(args, admin, summary, stored, summary["transactions"] if not maybe_discarded else None)
        return _finish(args, summary, t_start, 1)
    summary["decision"] = "COMMITTED"
    os.replace(staging, final)
    log.info("job %s: 4/4 dataset moved to %s; waiting for the broker to publish the events", job, final)
    info = deferred.wait_visible()
    summary["committed"] = info.members if info.resolved else 0
    log.info("job %s: %d transactions committed by the broker from the decision%s", job, info.members,
             "" if info.resolved else f" ({info.pending} still being ended)")
    _rolled_back(args, admin, summary, discarded if stored is not None else None, 0 if not maybe_discarded else None,
                 speculation)
    deferred.close()
    spark.stop()
    return _finish(args, summary, t_start, 0 if info.resolved else 3)


def _rolled_back(args, admin: AdminClient | None, summary: dict, watched: list[str] | None, otherwise: int | None,
                 speculation: bool = False) -> None:
    """summary["rolled_back"]: of `watched` (the half transactions the decision does not keep, listed
    through --admin-url before it), those the broker rolled back; without --admin-url `otherwise`
    (None: unknown, when Spark discarded task attempts the job cannot count)."""
    if watched is not None:
        s = settle(admin, args.group, summary["job_id"] or summary["job"], watched,
                   args.settle_seconds)
        summary["rolled_back"] = len(s["rolled_back"])
        summary["discarded"] = s["discarded"]
        summary["discarded_by"] = s["by"]
        summary["still_pending"] = len(s["still_pending"])
        log.info("job %s: %d half transactions rolled back (%s), %d still pending", summary["job"],
                 len(s["rolled_back"]), ", ".join(sorted(set(s["by"].values()))) or "-", len(s["still_pending"]))
        return
    summary["rolled_back"] = otherwise
    if otherwise is None:
        log.info("job %s: Spark discarded %d task attempt(s)%s; the broker rolls back their half transactions "
                 "with the decision, so rolled_back is unknown here (--admin-url counts them; `txbroker job show "
                 "%s` shows the job)", summary["job"], summary["discarded_attempts"],
                 " (speculation is on)" if speculation else "", summary["job_id"] or summary["job"])


def _finish(args, summary: dict, t_start: float, code: int) -> int:
    summary["seconds"] = round(time.monotonic() - t_start, 2)
    summary["exit_code"] = code
    rolled_back = "unknown" if summary["rolled_back"] is None else summary["rolled_back"]
    print(f"SUMMARY job={summary['job']} decision={summary['decision']} rows={summary['rows']} "
          f"transactions={summary['transactions']} committed={summary['committed']} "
          f"rolled_back={rolled_back} discarded_attempts={summary['discarded_attempts']} "
          f"seconds={summary['seconds']}", flush=True)
    if args.summary_json:
        tmp = args.summary_json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=2)
        os.replace(tmp, args.summary_json)
    return code


if __name__ == "__main__":
    sys.exit(main())
