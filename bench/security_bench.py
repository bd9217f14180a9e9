"""The cost of authentication and TLS: transactions/s with none, SCRAM authentication, TLS, and both.

    .venv/bin/python bench/security_bench.py [--seconds 10] [--runs 2] [--quick]

One fresh broker (ASYNC flush) per case and run; load from separate processes (this script with
--worker), each running producers (one connection each) in a closed loop of single-message
transactions (half send + acknowledged COMMIT), 1 KiB bodies, as the broker suite's "8 producers"
case. Authentication costs once per connection (a SCRAM exchange) and a dict lookup per request;
TLS costs per byte. Also measured: the time to open a connection ready for requests (connect,
TLS handshake, SCRAM exchange, heartbeat), sequentially from this process.

Writes bench/results/security-<time>.json (machine, versions, commands, raw figures) and
security-latest.json; prints a table. Never passes or fails on timing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "broker"))
from common import (  # noqa: E402
    PYTHON, RESULTS_DIR, BrokerProcess, CpuSnapshot, RandomBodies, loadavg, machine_info, percentiles, track, untrack,
)

from txbroker.client import (  # noqa: E402
    AsyncTransactionProducer, Credentials, LocalTransactionState, Message, TlsConfig, TransactionListener,
)

CASES = ("plain", "auth", "tls", "auth+tls")
GROUP = "bench-pg"
TOPIC = "BenchSec"


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT


# ---- the broker, with what each case needs ----------------------------------------------------------

class SecureBroker(BrokerProcess):
    """bench/broker/common.BrokerProcess, with readiness and topic creation over HTTPS + Basic."""

    def __init__(self, case: str, workdir: str):
        self.case = case
        extra = []
        self.credentials = self.tls = None
        if "auth" in case:
            creds = os.path.join(workdir, "credentials.toml")
            subprocess.run([PYTHON, "-m", "txbroker.cli.main", "auth", "add-user", "bench", "--file", creds,
                            "--topic", "*=PUB|SUB", "--producer-group", GROUP, "--admin"],
                           input="bench-secret\n", text=True, check=True, capture_output=True)
            extra += ["--auth-file", creds]
            self.credentials = Credentials("bench", "bench-secret")
        if "tls" in case:
            extra += ["--tls-cert", CERTS.server, "--tls-key", CERTS.server]
            self.tls = TlsConfig(ca_file=CERTS.ca)
        super().__init__("ASYNC", extra=extra)
        if self.tls is not None:
            self.admin = self.admin.replace("http://", "https://")

    def open_admin(self, path: str, data: bytes | None = None, timeout: float = 10):
        req = urllib.request.Request(self.admin + path, data=data, method="POST" if data else "GET",
                                     headers={"Content-Type": "application/json"})
        if self.credentials is not None:
            token = base64.b64encode(f"{self.credentials.access_key}:{self.credentials.secret_key}".encode())
            req.add_header("Authorization", "Basic " + token.decode())
        return urllib.request.urlopen(req, timeout=timeout, context=self.tls.context() if self.tls else None)

    def create_topic(self, name: str, queues: int) -> None:
        with self.open_admin("/api/v1/topics", json.dumps({"name": name, "queues": queues}).encode()) as r:
            r.read()

    def metrics_text(self) -> str:
        with self.open_admin("/metrics") as r:
            return r.read().decode()

    def client_options(self) -> dict:
        return {"credentials": self.credentials, "tls": self.tls}

    def worker_args(self) -> list[str]:
        args = []
        if self.credentials is not None:
            args += ["--access-key", self.credentials.access_key]  # the secret goes by environment
        if self.tls is not None:
            args += ["--tls-ca", self.tls.ca_file]
        return args


class Certs:
    def __init__(self, d: str):
        import trustme
        ca = trustme.CA()
        self.ca = os.path.join(d, "ca.pem")
        self.server = os.path.join(d, "server.pem")
        ca.cert_pem.write_to_path(self.ca)
        ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(self.server)


CERTS: Certs | None = None


# ---- a load process --------------------------------------------------------------------------------------

async def worker(args) -> dict:
    creds = Credentials(args.access_key, os.environ["BENCH_SECRET"]) if args.access_key else None
    tls = TlsConfig(ca_file=args.tls_ca) if args.tls_ca else None
    producers = [await AsyncTransactionProducer(GROUP, args.broker, Commit(), credentials=creds, tls=tls,
                                                request_timeout=30).start() for _ in range(args.producers)]
    body = RandomBodies(1024).next
    open_at, close_at = args.start + args.warmup, args.start + args.warmup + args.seconds
    lat: list[float] = []
    errors: dict[str, int] = {}
    done = 0
    await asyncio.sleep(max(0.0, args.start - time.monotonic()))

    async def loop(p):
        nonlocal done
        while True:
            t0 = time.monotonic()
            if t0 >= close_at:
                return
            try:
                r = await p.send_message_in_transaction(Message(TOPIC, body()))
                if r.end_error or r.local_state is not LocalTransactionState.COMMIT:
                    errors[r.end_error[:80] or r.send_status] = errors.get(r.end_error[:80] or r.send_status, 0) + 1
                    continue
            except Exception as e:  # noqa: BLE001 - counted and shown
                key = f"{type(e).__name__}: {str(e)[:80]}"
                errors[key] = errors.get(key, 0) + 1
                await asyncio.sleep(0.01)
                continue
            t1 = time.monotonic()
            if open_at <= t0 and t1 <= close_at:
                done += 1
                lat.append((t1 - t0) * 1000)

    await asyncio.gather(*(loop(p) for p in producers))
    for p in producers:
        await p.close()
    return {"transactions": done, "latency_ms": lat, "errors": errors}


def run_worker(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--broker", required=True)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--start", type=float, required=True)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--access-key")
    ap.add_argument("--tls-ca")
    args = ap.parse_args(argv)
    import uvloop
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        out = runner.run(worker(args))
    json.dump(out, sys.stdout)
    return 0


# ---- one case --------------------------------------------------------------------------------------------

async def connect_times(broker: SecureBroker, n: int) -> list[float]:
    """Milliseconds to get a producer connection ready for requests (connect, TLS, SCRAM, heartbeat)."""
    out = []
    for _ in range(n):
        p = AsyncTransactionProducer(GROUP, broker.address, Commit(), **broker.client_options())
        t0 = time.perf_counter()
        await p.start()
        out.append((time.perf_counter() - t0) * 1000)
        await p.close()
    return out


def run_case(case: str, seconds: float, warmup: float, procs: int, producers: int, workdir: str) -> dict:
    d = tempfile.mkdtemp(dir=workdir)
    result = {"case": case, "loadavg_before": loadavg()}
    with SecureBroker(case, d) as broker:
        broker.create_topic(TOPIC, 4)
        result["broker_command"] = shlex.join(broker.cmd)
        start = time.monotonic() + 3.0
        cmd = [PYTHON, __file__, "--worker", "--broker", broker.address, "--producers", str(producers),
               "--start", str(start), "--warmup", str(warmup), "--seconds", str(seconds), *broker.worker_args()]
        result["client_command"] = shlex.join(cmd) + f"  (x{procs} processes)"
        env = {**os.environ, "BENCH_SECRET": broker.credentials.secret_key if broker.credentials else ""}
        workers = [track(subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)) for _ in range(procs)]
        try:
            time.sleep(max(0.0, start + warmup - time.monotonic()))
            c0 = CpuSnapshot(broker.pid, [w.pid for w in workers])
            time.sleep(max(0.0, start + warmup + seconds - time.monotonic()))
            c1 = CpuSnapshot(broker.pid, [w.pid for w in workers])
            outs = [json.loads(w.communicate(timeout=seconds + 120)[0]) for w in workers]
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                untrack(w)
        result["connect_ms"] = {k: round(v, 3) if isinstance(v, float) else v
                                for k, v in percentiles(asyncio.run(connect_times(broker, 30))).items()}
    n = sum(o["transactions"] for o in outs)
    lat = [x for o in outs for x in o["latency_ms"]]
    errors: dict[str, int] = {}
    for o in outs:
        for k, v in o["errors"].items():
            errors[k] = errors.get(k, 0) + v
    cpu = c1.since(c0)
    result.update({
        "tx_per_s": round(n / seconds, 1), "latency_ms": {k: round(v, 3) if isinstance(v, float) else v
                                                          for k, v in percentiles(lat).items()},
        "errors": errors, "cpu": cpu, "loadavg_after": loadavg(),
        "broker_loop_us_per_tx": round(cpu["broker_main_thread_pct"] / 100 * seconds / n * 1e6, 1) if n else None,
    })
    return result


def main() -> int:
    if "--worker" in sys.argv:
        return run_worker(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured window per run (default 10)")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=2, help="runs per case; the best is reported (default 2)")
    ap.add_argument("--procs", type=int, default=2, help="load processes (default 2)")
    ap.add_argument("--producers", type=int, default=4, help="producers per process (default 4: 8 in all)")
    ap.add_argument("--cases", default=",".join(CASES), help="subset of " + ",".join(CASES))
    ap.add_argument("--quick", action="store_true", help="3 s windows, one run: a smoke test")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.warmup, args.runs = 3.0, 1.0, 1
    global CERTS
    workdir = tempfile.mkdtemp(prefix="txbroker-secbench-")
    CERTS = Certs(workdir)
    doc = {"benchmark": "security", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_info(),
           "settings": vars(args), "cases": {}}
    cases = [c for c in args.cases.split(",") if c]
    for r in range(args.runs):  # cases interleaved, so a change in machine load hits them alike
        for case in cases:
            res = run_case(case, args.seconds, args.warmup, args.procs, args.producers, workdir)
            doc["cases"].setdefault(case, []).append(res)
            print(f"run {r + 1} {case:9} {res['tx_per_s']:>9,.0f} tx/s  p50 {res['latency_ms'].get('p50', 0):.2f} ms  "
                  f"connect {res['connect_ms'].get('p50', 0):.2f} ms  errors {sum(res['errors'].values())}",
                  flush=True)
    best = {c: max(runs, key=lambda x: x["tx_per_s"]) for c, runs in doc["cases"].items()}
    doc["best"] = {c: {"tx_per_s": b["tx_per_s"], "p50_ms": b["latency_ms"].get("p50"),
                       "p99_ms": b["latency_ms"].get("p99"), "connect_p50_ms": b["connect_ms"].get("p50"),
                       "broker_loop_us_per_tx": b["broker_loop_us_per_tx"],
                       "runs_tx_per_s": [x["tx_per_s"] for x in doc["cases"][c]]} for c, b in best.items()}
    plain = best.get("plain", {}).get("tx_per_s")
    print(f"\n{args.procs * args.producers} producers (one connection each), single-message transactions, "
          f"1 KiB, ASYNC flush; best of {args.runs} x {args.seconds:.0f} s")
    print(f"{'case':10} {'tx/s':>9} {'vs plain':>9} {'p50 ms':>7} {'p99 ms':>7} {'loop us/tx':>10} {'connect ms':>10}")
    for c, b in doc["best"].items():
        rel = f"{(b['tx_per_s'] / plain - 1) * 100:+.1f}%" if plain else "-"
        print(f"{c:10} {b['tx_per_s']:>9,.0f} {rel:>9} {b['p50_ms'] or 0:>7.2f} {b['p99_ms'] or 0:>7.2f} "
              f"{b['broker_loop_us_per_tx'] or 0:>10} {b['connect_p50_ms'] or 0:>10.2f}")
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
    for name in (f"security-{stamp}.json", "security-latest" + ("-quick" if args.quick else "") + ".json"):
        (RESULTS_DIR / name).write_text(json.dumps(doc, indent=1))
    print(f"\nwritten: bench/results/security-{stamp}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
