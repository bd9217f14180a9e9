#!/usr/bin/env python3
"""Orders job: write a result dataset and publish one event per order, tied to that write.

RocketMQ's transactional pattern with Spark in the middle:

  1. the events go out as half messages (`format("txbroker")`, commit=deferred): stored, invisible;
  2. the local transaction: the result dataset is written as Parquet to OUTPUT/_staging/<job>;
  3. the commit marker: the job's decision in the ledger (COMMITTED, with the exact transaction ids of
     the task attempts Spark kept). This single atomic file is the commit point of both;
  4. the dataset is moved to OUTPUT/job=<job> (visible), and the ENDs make the events visible.

A crash before 3 leaves neither: the ledger checker rolls the events back once the driver is known
dead (or past the deadline) and the next run deletes the staging directory. A crash after 3 leaves
both: the checker commits the events, the next run finishes the move (`recover`). Transactions of
task attempts Spark discarded (a failed or speculative attempt) are not in the decision: the checker
rolls them back at check-back.

    python spark/jobs/orders_job.py --brokers 127.0.0.1:10911 --group orders-publisher \
        --ledger /tmp/ledger --input /tmp/orders --output /tmp/orders-result [--fail-partition 1]

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
import urllib.request
from pathlib import Path

log = logging.getLogger("orders_job")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[2,4])")
    p.add_argument("--brokers", required=True, help="HOST:PORT[,HOST:PORT...]")
    p.add_argument("--topic", default="OrderEvents")
    p.add_argument("--group", default="orders-publisher", help="producer group (the checker joins it)")
    p.add_argument("--ledger", default=os.environ.get("TXBROKER_LEDGER", "~/.txbroker/ledger"))
    p.add_argument("--input", required=True, help="orders dataset (Parquet); generated if missing")
    p.add_argument("--output", required=True, help="result dataset root (Parquet, one job=<id> directory per run)")
    p.add_argument("--orders", type=int, default=10_000, help="orders to generate when the input is missing")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the publishing stage")
    p.add_argument("--batch-size", type=int, default=500, help="events per transaction")
    p.add_argument("--deadline-seconds", type=float, default=600.0)
    p.add_argument("--fail-partition", type=int, default=None,
                   help="inject a failure: the first attempt of this partition fails after sending its half messages")
    p.add_argument("--fail-mode", choices=["crash", "raise"], default="crash",
                   help="crash: its Python worker dies (nothing cleans up); raise: the task raises")
    p.add_argument("--inject-crash", choices=["after-dataset", "after-decision"], default=None,
                   help="inject a failure (tests): the driver exits at once after writing the dataset (before the "
                        "decision) or after recording the decision (before the move and the ENDs)")
    p.add_argument("--progress-seconds", type=float, default=10.0,
                   help="log the running stage's progress this often (0: only when it ends)")
    p.add_argument("--admin-url", default=None,
                   help="broker admin URL: wait for the discarded attempts' transactions to be rolled back by "
                        "check-back, and count them (without it, rolled_back is unknown when Spark discarded "
                        "task attempts)")
    p.add_argument("--settle-seconds", type=float, default=120.0, help="how long to wait for that")
    p.add_argument("--summary-json", default=None, help="also write the summary here")
    p.add_argument("--log-level", default="INFO")
    from txbroker_spark.security import add_arguments

    add_arguments(p)
    return p.parse_args(argv)


def recover(output: Path, ledger) -> None:
    """Finish or clean up earlier runs: a staging dataset whose job was decided is moved or deleted."""
    staging = output / "_staging"
    if not staging.is_dir():
        return
    for d in sorted(staging.iterdir()):
        decision = ledger.job_decision(d.name) if d.is_dir() else None
        if decision is None:
            continue  # undecided: still running, or the checker will decide
        if decision.committed:
            final = output / f"job={d.name}"
            if not final.exists():
                os.replace(d, final)
                log.warning("recovered job %s: decided COMMITTED, dataset moved to %s", d.name, final)
        else:
            shutil.rmtree(d, ignore_errors=True)
            log.warning("cleaned up job %s: decided ABORTED (%s), staging dataset deleted", d.name, decision.reason)


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


def pending_of(admin_url: str, group: str, prefix: str) -> list[str]:
    with urllib.request.urlopen(f"{admin_url}/api/v1/transactions?group={group}&limit=100000", timeout=10) as r:
        doc = json.load(r)
    return [t["transaction_id"] for t in doc["transactions"] if t["transaction_id"].startswith(prefix)]


def final_state(admin_url: str, txid: str) -> dict:
    with urllib.request.urlopen(f"{admin_url}/api/v1/transactions/{txid}", timeout=10) as r:
        return json.load(r)


def settle(admin_url: str, group: str, job: str, discarded: list[str], timeout: float) -> dict:
    """Wait until the discarded attempts' half transactions are no longer pending; report how they ended."""
    prefix = f"{job}-"
    deadline = time.monotonic() + timeout
    waiting = set(discarded)
    while waiting and time.monotonic() < deadline:
        waiting &= set(pending_of(admin_url, group, prefix))
        if waiting:
            time.sleep(0.2)
    states = {t: final_state(admin_url, t) for t in discarded}
    rolled_back = [t for t, s in states.items() if s.get("state") == "ROLLED_BACK"]
    return {"discarded": discarded, "rolled_back": rolled_back, "still_pending": sorted(waiting),
            "by": {t: s.get("by", "") for t, s in states.items()}}


def _crash(args, where: str) -> None:
    """Failure injection: die here as a lost driver would (its JVM exits when its stdin closes)."""
    if args.inject_crash == where:
        log.warning("inject-crash=%s: the driver exits now", where)
        logging.shutdown()
        os._exit(17)


def _cause(e: Exception) -> str:
    """The first telling line of an error (a Py4J error starts with "An error occurred while calling ...")."""
    lines = [ln.strip(" :\t") for ln in str(e).splitlines()]
    useful = [ln for ln in lines if ln and not ln.startswith("An error occurred while calling")]
    return (useful or [type(e).__name__])[0][:300]


def _discarded(progress, speculation: bool) -> tuple[int, bool]:
    """(task attempts Spark is known to have discarded, whether it may have discarded others): a
    failed attempt, a stage run again, or a speculative copy, whose half transactions check-back
    rolls back without this job hearing of it."""
    final = progress.final
    return final.failed, bool(final.failed or final.stage_retries or speculation)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stdout,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from txbroker_spark import DeferredJob, JobAborted, Ledger, local_session, register
    from txbroker_spark.datasource import new_job_id
    from txbroker_spark.options import OptionError
    from txbroker_spark.progress import StageProgress
    from txbroker_spark.security import flag_message, from_args, options_from_args

    try:  # the flags, else the environment: the same settings the data source resolves from its options
        security = from_args(args)
    except OptionError as e:
        print(f"orders_job: {flag_message(e)}", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    output, inp = Path(args.output).absolute(), Path(args.input).absolute()
    ledger_dir = os.path.abspath(os.path.expanduser(args.ledger))
    ledger = Ledger(ledger_dir).ensure()
    recover(output, ledger)

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
    # threw away (their half transactions are rolled back by check-back).
    summary = {"job": job, "rows": 0, "transactions": 0, "committed": 0, "rolled_back": None,
               "discarded_attempts": 0, "seconds": 0.0,
               "decision": None, "dataset": str(final), "topic": args.topic, "group": args.group,
               "ledger": ledger_dir}

    events = (result.select("order_id", "customer_id", "total", "status", F.lit(job).alias("job"))
              .repartition(args.partitions, "order_id"))
    writer = (events.write.format("txbroker")
              .option("brokers", args.brokers).option("topic", args.topic).option("producerGroup", args.group)
              .option("ledger", ledger_dir).option("jobId", job).option("commit", "deferred")
              .option("keyColumn", "order_id").option("tagsColumn", "status")
              .option("batchSize", args.batch_size).option("deadlineSeconds", args.deadline_seconds)
              .options(**options_from_args(args)))  # credentials and TLS flags; absent: the environment
    if args.fail_partition is not None:
        writer = writer.option("inject.failPartition", args.fail_partition).option("inject.failMode", args.fail_mode)
        log.info("injecting a failure: the first attempt of partition %d fails (%s) after sending its half messages",
                 args.fail_partition, args.fail_mode)
    deferred = DeferredJob(ledger_dir, args.brokers, args.group, job, security=security)
    discarded: list[str] = []
    sc = spark.sparkContext
    speculation = sc.getConf().get("spark.speculation", "false").lower() == "true"
    sending = StageProgress(sc, f"{job}-send", f"job {job}: 1/4 sending", log.info, args.progress_seconds)
    maybe_discarded = True  # until the sending stage's counts say otherwise
    try:
        t0 = time.monotonic()
        log.info("job %s: 1/4 sending one event per order as half messages to %s", job, args.topic)
        try:
            with sending:
                writer.mode("append").save()
        finally:
            summary["discarded_attempts"], maybe_discarded = _discarded(sending, speculation)
        summary["rows"], summary["transactions"] = deferred.rows, len(deferred.txids)
        log.info("job %s: %d events stored invisibly in %d transactions (%.1fs)", job, summary["rows"],
                 summary["transactions"], time.monotonic() - t0)
        if args.admin_url:  # before the decision nothing of this job can have been resolved yet
            kept = set(deferred.txids)
            discarded = [t for t in pending_of(args.admin_url.rstrip("/"), args.group, f"{job}-") if t not in kept]
            if discarded:
                log.info("job %s: %d half transactions of discarded task attempts will be rolled back by "
                         "check-back: %s", job, len(discarded),
                         ", ".join(discarded[:6]) + (" ..." if len(discarded) > 6 else ""))
        t0 = time.monotonic()
        log.info("job %s: 2/4 local transaction: writing the result dataset to %s", job, staging)
        with StageProgress(sc, f"{job}-dataset", f"job {job}: 2/4 writing the dataset", log.info,
                           args.progress_seconds):
            result.write.mode("errorifexists").parquet(str(staging))
        log.info("job %s: dataset written (%.1fs)", job, time.monotonic() - t0)
        _crash(args, "after-dataset")
        log.info("job %s: 3/4 commit marker: recording the decision in the ledger", job)
        deferred.decide(commit=True, reason="dataset written")
        _crash(args, "after-decision")
    except JobAborted as e:  # the checker decided first (deadline): decide() rolled back what it prepared
        log.error("job %s: %s", job, e)
        shutil.rmtree(staging, ignore_errors=True)
        summary["decision"] = "ABORTED"
        _rolled_back(args, summary, job, len(deferred.txids), maybe_discarded, set(deferred.txids))
        return _finish(args, summary, t_start, 2)
    except Exception as e:  # noqa: BLE001 - anything before the decision aborts the job
        log.error("job %s failed before its decision (%s): aborting", job, _cause(e))
        d = deferred.decide(commit=False, reason=f"job failed: {type(e).__name__}")
        if d.committed:  # pragma: no cover - cannot happen: only this process commits
            raise
        prepared = deferred.ledger.prepared(job)
        shutil.rmtree(staging, ignore_errors=True)
        summary["decision"] = "ABORTED"
        if prepared is None:  # the write itself failed: the data source's abort rolled back what it knew of
            log.info("job %s: the data source rolled back the half transactions of its finished tasks; "
                     "check-back rolls back the rest", job)
            return _finish(args, summary, t_start, 1)
        rep = deferred.publish()
        summary["transactions"] = len(prepared["txids"])
        log.info("job %s: %s", job, rep.summary())
        _rolled_back(args, summary, job, rep.acknowledged, maybe_discarded, set(prepared["txids"]))
        return _finish(args, summary, t_start, 1)
    summary["decision"] = "COMMITTED"
    os.replace(staging, final)
    log.info("job %s: 4/4 dataset moved to %s; committing the events", job, final)
    rep = deferred.publish()
    summary["committed"] = rep.acknowledged
    if rep.undelivered or rep.refused:
        log.error("job %s: %s (the checker will finish undelivered commits)", job, rep.summary())
    log.info("job %s: %s", job, rep.summary())
    _rolled_back(args, summary, job, 0, maybe_discarded, set(deferred.txids), discarded, speculation)
    spark.stop()
    return _finish(args, summary, t_start, 0 if not (rep.undelivered or rep.refused) else 3)


def _rolled_back(args, summary: dict, job: str, own: int, maybe_discarded: bool, kept: set[str],
                 discarded: list[str] | None = None, speculation: bool = False) -> None:
    """summary["rolled_back"]: the job's own rollbacks plus the discarded attempts' transactions, which
    check-back rolls back: counted with --admin-url, 0 when Spark discarded no attempt, else unknown."""
    if args.admin_url:
        if discarded is None:  # nothing of the job is pending but what it does not know of
            discarded = [t for t in pending_of(args.admin_url.rstrip("/"), args.group, f"{job}-") if t not in kept]
        s = settle(args.admin_url.rstrip("/"), args.group, job, discarded, args.settle_seconds)
        summary["rolled_back"] = own + len(s["rolled_back"])
        summary["discarded"] = s["discarded"]
        summary["discarded_by"] = s["by"]
        summary["still_pending"] = len(s["still_pending"])
        log.info("job %s: %d discarded transactions rolled back (%s), %d still pending", job,
                 len(s["rolled_back"]), ", ".join(sorted(set(s["by"].values()))) or "-", len(s["still_pending"]))
    elif not maybe_discarded:
        summary["rolled_back"] = own
    else:
        summary["rolled_back"] = None
        log.info("job %s: Spark discarded %d task attempt(s)%s; check-back rolls back their half transactions "
                 "from the ledger now that the job is decided, so rolled_back is unknown here (--admin-url waits "
                 "and counts them; `txbroker tx list --group %s` shows any still pending)", job,
                 summary["discarded_attempts"], " (speculation is on)" if speculation else "", args.group)


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
