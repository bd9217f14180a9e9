#!/usr/bin/env python3
"""Coordinated transactions: how long one decision takes to make N member transactions visible.

    .venv/bin/python bench/job_bench.py [--members 10000] [--messages 1] [--flush ASYNC|SYNC] [--repeat 3]

Starts a local broker, opens a job, sends N member transactions into it (256 in flight, each of
`--messages` messages), then times: the decision request (COMMIT with the N ids: until the broker
acknowledged it, i.e. the decision record is durable), and decision-to-visible (until the job reports
resolved: every member ended and published, so a consumer sees all of them). Also reports the
sending rate and the broker's own histogram (txbroker_job_decision_to_visible_seconds). Prints the
figures and writes JSON to bench/results/job-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUP = "bench-jobs"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def one_job(address: str, members: int, messages: int, run: int) -> dict:
    from txbroker.client import AsyncJobCoordinator, Message

    async with AsyncJobCoordinator(GROUP, address, request_timeout=120) as c:
        job = await c.open(timeout=3600)
        sem = asyncio.Semaphore(256)

        async def send(i: int) -> str:
            async with sem:
                return await c.send(job.job_id, [Message("JobBench", f"r{run}-m{i}-{k}".encode())
                                                 for k in range(messages)], f"{job.job_id}-{i}")

        t0 = time.perf_counter()
        txids = await asyncio.gather(*(send(i) for i in range(members)))
        t_sent = time.perf_counter()
        await c.commit(job.job_id, txids)
        t_decided = time.perf_counter()
        while not (await c.describe(job.job_id)).resolved:
            await asyncio.sleep(0.001)
        t_visible = time.perf_counter()
    return {"members": members, "messages_per_member": messages, "send_seconds": round(t_sent - t0, 3),
            "members_per_s": round(members / (t_sent - t0)), "decision_seconds": round(t_decided - t_sent, 4),
            "decision_to_visible_seconds": round(t_visible - t_sent, 4)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--members", type=int, default=10_000)
    p.add_argument("--messages", type=int, default=1, help="messages per member transaction")
    p.add_argument("--flush", choices=["ASYNC", "SYNC"], default="SYNC")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--output", default=None)
    args = p.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="txbroker-job-bench-"))
    port, admin = _port(), _port()
    cli = Path(sys.executable).parent / "txbroker"
    log = open(workdir / "broker.log", "ab")
    proc = subprocess.Popen([str(cli), "broker", "--data-dir", str(workdir / "data"), "--listen", f"127.0.0.1:{port}",
                             "--admin-listen", f"127.0.0.1:{admin}", "--flush-disk-type", args.flush,
                             "--log-level", "WARNING"], stdout=log, stderr=subprocess.STDOUT)
    runs = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("broker did not start")
                time.sleep(0.1)
        print(f"[bench] {args.members:,} members x {args.messages} message(s), flush {args.flush}, "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus", flush=True)
        for run in range(args.repeat):
            r = asyncio.run(one_job(f"127.0.0.1:{port}", args.members, args.messages, run))
            runs.append(r)
            print(f"[bench] run {run + 1}: sent in {r['send_seconds']:.2f} s ({r['members_per_s']:,} members/s); "
                  f"decision acknowledged in {r['decision_seconds'] * 1000:.1f} ms; all {args.members:,} visible "
                  f"{r['decision_to_visible_seconds'] * 1000:.0f} ms after the decision was sent", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
    best = min(runs, key=lambda r: r["decision_to_visible_seconds"])
    result = {"members": args.members, "messages": args.messages, "flush": args.flush, "runs": runs, "best": best,
              "python": platform.python_version(), "cpus": os.cpu_count(),
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out = Path(args.output) if args.output else ROOT / "bench" / "results" / f"job-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"[bench] best: decision {best['decision_seconds'] * 1000:.1f} ms, decision to visible "
          f"{best['decision_to_visible_seconds'] * 1000:.0f} ms; results in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
