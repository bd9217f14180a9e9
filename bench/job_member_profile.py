#!/usr/bin/env python3
"""Where the broker's time goes for a Spark-shaped job: py-spy of one broker while 1,000-message
keyed members are sent (in queue order, as the Spark task sends them), then while they are ended.

    .venv/bin/python bench/job_member_profile.py [--members 300] [--messages 1000] [--rate 500]

Prints the sending and ending rates and, for each phase, the broker's busy samples by the frame
running (self) and by the frames on the stack (inclusive). Samples of the loop waiting in select
are left out. A profile, not a comparison: py-spy's sampling slows the broker a little."""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "broker_image"))

from txbroker.client import AsyncJobCoordinator, Message  # noqa: E402

QUEUES = 4  # the broker's default queue count for an auto-created topic
PROPS = {"txbroker.spark.partition": "1", "txbroker.spark.attempt": "7", "txbroker.spark.job": "j" * 30}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def member(i: int, n: int) -> list[Message]:
    out = []
    for k in range(n):
        key = f"o-{i * n + k:09d}"
        body = b'{"id":%d,"order_id":"%s","amount":12.5,"created_at":"2026-01-01T00:00:00Z"}' % (i * n + k, key.encode())
        out.append(Message("Spark", body, "", key, dict(PROPS), queue_id=zlib.crc32(key.encode()) % QUEUES))
    out.sort(key=lambda m: m.queue_id)
    return out


def spy(pid: int, out: Path, rate: int) -> subprocess.Popen:
    py_spy = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen([str(py_spy), "record", "--pid", str(pid), "--format", "raw", "-o", str(out),
                             "--rate", str(rate), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGINT)
    p.wait(timeout=60)


async def run(address: str, pid: int, args, workdir: Path) -> dict:
    async with AsyncJobCoordinator("profile", address, request_timeout=120) as c:
        job = await c.open(timeout=3600)
        members = [member(i, args.messages) for i in range(args.members)]
        sem = asyncio.Semaphore(4)  # a Spark task's prepares in flight (maxInflight's default)

        async def send(i: int) -> str:
            async with sem:
                return await c.send(job.job_id, members[i], f"{job.job_id}-{i}")

        p = spy(pid, workdir / "send.raw", args.rate)
        await asyncio.sleep(1)  # py-spy attached
        t0 = time.perf_counter()
        txids = await asyncio.gather(*(send(i) for i in range(args.members)))
        sent = time.perf_counter() - t0
        stop(p)
        p = spy(pid, workdir / "end.raw", args.rate)
        await asyncio.sleep(1)
        t0 = time.perf_counter()
        await c.commit(job.job_id, txids)
        while not (await c.describe(job.job_id)).resolved:
            await asyncio.sleep(0.001)
        ended = time.perf_counter() - t0
        stop(p)
    return {"send": sent, "end": ended}


def report(raw: Path, top: int) -> None:
    own, inclusive, total = collections.Counter(), collections.Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if "select" in frames[-1] or "epoll" in frames[-1]:
            continue  # the loop waiting
        total += int(n)
        own[frames[-1]] += int(n)
        for f in set(frames):
            inclusive[f] += int(n)
    print(f"  {total} busy samples; by the frame running:")
    for f, n in own.most_common(top):
        print(f"    {100 * n / total:5.1f} %  {f}")
    print("  inclusive (the frame or what it called; frames on every sample, the loop's own, left out):")
    for f, n in [(f, n) for f, n in inclusive.most_common() if n < total][:top]:
        print(f"    {100 * n / total:5.1f} %  {f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=300)
    ap.add_argument("--messages", type=int, default=1000, help="messages per member")
    ap.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="txbroker-member-profile-"))
    port, admin = _port(), _port()
    cli = Path(sys.executable).parent / "txbroker"
    broker = subprocess.Popen([str(cli), "broker", "--data-dir", str(workdir / "data"), "--listen",
                               f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}", "--log-level", "WARNING"])
    try:
        deadline = time.monotonic() + 30
        while True:  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or broker.poll() is not None:
                    raise SystemExit("the broker did not start")
                time.sleep(0.05)
        t = asyncio.run(run(f"127.0.0.1:{port}", broker.pid, args, workdir))
        n = args.members * args.messages
        for phase in ("send", "end"):
            print(f"== {phase}: {n:,} messages in {t[phase]:.2f} s ({n / t[phase]:,.0f} msgs/s)")
            report(workdir / f"{phase}.raw", args.top)
    finally:
        broker.terminate()
        broker.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
