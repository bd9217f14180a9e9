"""The Spark demo: publish one event per order exactly once, through an injected task failure.

    python -m txbroker_spark.demo [--brokers HOST:PORT[,...] --admin-url URL] [--orders 2000]

Without --brokers it starts a local master+slave broker pair (SYNC replication, SYNC flush, fast
check-back) on free ports in a temporary directory. Then it runs the orders job
(spark/jobs/orders_job.py) in local[*,4] (every core, up to 4 attempts per task) with the first
attempt of partition 1 crashing after it has sent its half messages,
reads the topic back with a plain consumer, and prints a verification table: every order of the
committed dataset arrived exactly once, with the dataset's content, and nothing from the failed
attempt (the broker rolled its transactions back when it recorded the job's decision, which does
not name them). No checker process and no ledger: the decision lives in the broker. Exit status 0
when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

from txbroker.client.admin import AdminClient

GROUP = "orders-publisher"
TOPIC = "OrderEvents"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _txbroker_cli() -> str:
    local = Path(sys.executable).parent / "txbroker"
    return str(local) if local.exists() else (shutil.which("txbroker") or "txbroker")


def _wait_ready(admin_url: str, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{admin_url}/readyz", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not become ready in {timeout:.0f}s")


def start_local_brokers(workdir: Path) -> tuple[str, str, list[subprocess.Popen]]:
    """The embedded default: a local master and its slave, SYNC replication and SYNC flush, so
    every acknowledged commit is on both. Returns ("master,slave", the master's admin URL, processes).
    """
    procs = []
    addresses = []
    admin_url = ""
    for role in ("master", "slave"):
        port, admin = _port(), _port()
        extra = ["--role", "slave", "--master", addresses[0]] if role == "slave" else []
        log = open(workdir / f"broker-{role}.log", "ab")
        proc = subprocess.Popen([_txbroker_cli(), "broker", "--data-dir", str(workdir / f"broker-{role}-data"),
                                 "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
                                 "--broker-name", f"demo-{role}", "--flush-disk-type", "SYNC",
                                 "--replication-mode", "SYNC", "--check-interval-ms", "500",
                                 "--transaction-timeout-ms", "500", *extra], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        procs.append(proc)
        url = f"http://127.0.0.1:{admin}"
        _wait_ready(url, proc, f"the {role} broker")
        addresses.append(f"127.0.0.1:{port}")
        if role == "master":
            admin_url = url
    _wait_in_sync(admin_url)
    return ",".join(addresses), admin_url, procs


def _wait_in_sync(admin_url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(s.in_sync for s in AdminClient(admin_url).broker_info().replication.slaves):
            return
        time.sleep(0.1)
    raise SystemExit("the slave did not catch up with the master")


def _find_job(arg: str | None) -> Path:
    candidates = [Path(arg)] if arg else [
        Path(os.environ.get("TXBROKER_SPARK_JOBS", "/nonexistent")) / "orders_job.py",
        Path(__file__).resolve().parents[1] / "jobs" / "orders_job.py",
        Path("/opt/txbroker/jobs/orders_job.py"),
    ]
    for c in candidates:
        if c.is_file():
            return c
    raise SystemExit(f"orders job not found (looked at {', '.join(map(str, candidates))}); pass --job PATH")


def _pump(stream, prefix: str) -> None:
    for line in iter(stream.readline, ""):
        if "SUMMARY" in line or " orders_job " in line or line.startswith("Traceback"):
            print(f"{prefix}{line.rstrip()}", flush=True)


def _read_dataset(path: Path) -> dict[str, tuple[str, str]]:
    import pyarrow.parquet as pq

    table = pq.read_table(str(path), columns=["order_id", "total", "status"])
    out = {}
    for oid, total, status in zip(*(table.column(c).to_pylist() for c in ("order_id", "total", "status"))):
        out[oid] = (str(total), status)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m txbroker_spark.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", help="use these brokers (HOST:PORT[,...]) instead of starting a local master+slave "
                                     "pair")
    p.add_argument("--admin-url", help="admin URL of the master (required with --brokers)")
    p.add_argument("--orders", type=int, default=2000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--fail-partition", type=int, default=1)
    # local[*] retries no task (one attempt per task): ",4" allows the retry the demo's crash needs
    p.add_argument("--master", default="local[*,4]", help="Spark master: every core, up to 4 attempts per task")
    p.add_argument("--workdir", help="keep everything here (default: a temporary directory, removed at the end)")
    p.add_argument("--job", help="path of orders_job.py")
    args = p.parse_args(argv)
    if args.brokers and not args.admin_url:
        p.error("--admin-url is needed with --brokers (to set the group's check-back and verify)")

    t_start = time.monotonic()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="txbroker-spark-demo-")).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        if args.brokers:
            brokers, admin_url = args.brokers, args.admin_url.rstrip("/")
            _say(f"using brokers {brokers} (admin {admin_url})")
        else:
            brokers, admin_url, started = start_local_brokers(workdir)
            procs += started
            _say(f"started a local master+slave broker pair on {brokers} (SYNC replication and flush), "
                 f"data in {workdir}")
        # The group's transactions must all join a job (TxProducerGroup checkMode ledger): the
        # broker answers for them from the job's decision, so nothing else has to.
        AdminClient(admin_url).put_group(GROUP, {"require_job": True})

        job_path = _find_job(args.job)
        summary_path = workdir / "summary.json"
        cmd = [sys.executable, str(job_path), "--master", args.master, "--brokers", brokers, "--topic", TOPIC,
               "--group", GROUP, "--input", str(workdir / "orders"),
               "--output", str(workdir / "result"), "--orders", str(args.orders), "--partitions",
               str(args.partitions), "--batch-size", "100", "--fail-partition", str(args.fail_partition),
               "--fail-mode", "crash", "--admin-url", admin_url, "--summary-json", str(summary_path)]
        _say(f"running the orders job in {args.master}: {args.orders} orders, {args.partitions} partitions, the "
             f"first attempt of partition {args.fail_partition} crashes after sending its half messages")
        job_log = workdir / "job.log"
        with open(job_log, "w") as jl:
            job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=jl, text=True)
            procs.append(job)
            pump = threading.Thread(target=_pump, args=(job.stdout, "  | "), daemon=True)
            pump.start()
            code = job.wait()
            pump.join(5)
        if code != 0 or not summary_path.exists():
            _say(f"the orders job failed (exit {code}); see {job_log}")
            return 1
        summary = json.loads(summary_path.read_text())
        return verify(brokers, admin_url, summary, t_start)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def verify(brokers: str, admin_url: str, summary: dict, t_start: float) -> int:
    from txbroker.client import PullConsumer

    from txbroker_spark.options import P_ATTEMPT, P_JOB

    dataset = _read_dataset(Path(summary["dataset"]))
    with PullConsumer(brokers) as consumer:
        events = [m for m in consumer.read_all(TOPIC) if m.properties.get(P_JOB) == summary["job_id"]]
    bodies = [json.loads(m.body) for m in events]
    counts = Counter(b["order_id"] for b in bodies)
    job = AdminClient(admin_url).job(summary["job_id"])
    committed = set(job.member_ids) if job.state == "COMMITTED" else set()
    failed_attempts = sorted({t.split("-t")[-1].split("-c")[0] for t in summary.get("discarded", [])})
    from_failed = sum(1 for m in events if m.properties.get(P_ATTEMPT) in failed_attempts)
    matching = sum(1 for b in bodies if dataset.get(b["order_id"]) == (str(b["total"]), b["status"]))
    outside = sum(1 for m in events if m.transaction_id not in committed)
    pending = AdminClient(admin_url).transactions(group=GROUP, limit=0).total
    by_job = sum(1 for b in summary.get("discarded_by", {}).values() if b == "job")
    n = len(dataset)
    rows = [
        ("orders in the committed dataset", n, n),
        ("events received by the consumer", n, len(events)),
        ("distinct orders among the events", n, len(counts)),
        ("orders received more than once", 0, sum(1 for c in counts.values() if c > 1)),
        ("events equal to their dataset row", n, matching),
        ("events outside the job's committed transactions", 0, outside),
        (f"events from the failed attempt (task {','.join(failed_attempts) or '-'})", 0, from_failed),
        ("failed attempt's transactions rolled back", len(summary.get("discarded", [])), summary["rolled_back"]),
        ("... of which by the broker, from the job's decision", len(summary.get("discarded", [])), by_job),
        ("transactions still pending", 0, pending),
    ]
    ok = all(exp == got for _, exp, got in rows) and n > 0 and bool(failed_attempts)
    print()
    print(f"{'check':<52}{'expected':>10}{'actual':>10}  ok")
    print("-" * 76)
    for name, exp, got in rows:
        print(f"{name:<52}{exp:>10}{got:>10}  {'yes' if exp == got else 'NO'}")
    print("-" * 76)
    print(f"job {summary['job']}: {summary['rows']} rows, {summary['transactions']} transactions, "
          f"{summary['committed']} committed, {summary['rolled_back']} rolled back; job {summary['seconds']:.1f}s, "
          f"demo {time.monotonic() - t_start:.1f}s")
    if not failed_attempts:
        print("the injected failure did not happen: nothing from a failed attempt to check")
    print("RESULT:", "every event arrived exactly once, none from the failed attempt" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
