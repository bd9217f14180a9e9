#!/usr/bin/env python3
"""Where the broker's time goes for a Spark-shaped job: py-spy of one broker while 1,000-message
keyed members are sent (in queue order, as the Spark task sends them), then while they are ended.

    .venv/bin/python bench/job_member_profile.py [--members 300] [--messages 1000] [--rate 500]
        [--properties shared|each] [--no-profile]

Prints the sending and ending rates, the broker's CPU per message in each phase, the end again up
to when every key is written (the key index is written behind the log: `end and keys`), and, for
the two phases, the broker's busy samples by the frame running (self) and by the frames on the stack
(inclusive). Samples of the loop waiting in select are left out. py-spy's sampling slows the
broker a little: for before/after figures of a change, `--no-profile`, runs interleaved.
`--properties each` sends the task's properties with every message (as before SEND_MESSAGE_SHARED);
`shared` (the default, as the Spark task sends) once per member."""

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
import urllib.request
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


def member(i: int, n: int, each: bool) -> list[Message]:
    out = []
    for k in range(n):
        key = f"o-{i * n + k:09d}"
        body = b'{"id":%d,"order_id":"%s","amount":12.5,"created_at":"2026-01-01T00:00:00Z"}' % (i * n + k, key.encode())
        out.append(Message("Spark", body, "", key, dict(PROPS) if each else {},
                           queue_id=zlib.crc32(key.encode()) % QUEUES))
    out.sort(key=lambda m: m.queue_id)
    return out


def cpu_seconds(pid: int) -> float:
    """The event loop's thread's CPU so far (RocksDB's background flushes and compactions, on
    threads of their own, come in bursts that land in either phase), from its scheduler stats."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def spy(pid: int, out: Path, rate: int) -> subprocess.Popen | None:
    if not rate:
        return None
    py_spy = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen([str(py_spy), "record", "--pid", str(pid), "--format", "raw", "-o", str(out),
                             "--rate", str(rate), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(p: subprocess.Popen | None) -> None:
    if p is None:
        return
    p.send_signal(signal.SIGINT)
    p.wait(timeout=60)


def key_backlog(admin: str) -> float:
    """The broker's txbroker_key_index_backlog_messages (its key index is written behind the log)."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("txbroker_key_index_backlog_messages "):
                return float(line.split()[1])
    return 0.0  # a broker that writes every key with its record


async def run(address: str, admin: str, pid: int, args, workdir: Path) -> dict:
    async with AsyncJobCoordinator("profile", address, request_timeout=120) as c:
        job = await c.open(timeout=3600)
        each = args.properties == "each"
        members = [member(i, args.messages, each) for i in range(args.members)]
        shared = None if each else PROPS
        sem = asyncio.Semaphore(4)  # a Spark task's prepares in flight (maxInflight's default)

        async def send(i: int) -> str:
            async with sem:
                return await c.send(job.job_id, members[i], f"{job.job_id}-{i}", properties=shared)

        p = spy(pid, workdir / "send.raw", args.rate)
        if p is not None:
            await asyncio.sleep(1)  # py-spy attached
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        txids = await asyncio.gather(*(send(i) for i in range(args.members)))
        sent, sent_cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
        stop(p)
        p = spy(pid, workdir / "end.raw", args.rate)
        if p is not None:
            await asyncio.sleep(1)
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        await c.commit(job.job_id, txids)
        while not (await c.describe(job.job_id)).resolved:
            await asyncio.sleep(0.001)
        ended, ended_cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
        stop(p)
        while await asyncio.to_thread(key_backlog, admin):  # until every key is findable
            await asyncio.sleep(0.005)
        keyed, keyed_cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    return {"send": (sent, sent_cpu), "end": (ended, ended_cpu), "end and keys": (keyed, keyed_cpu)}


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
    ap.add_argument("--properties", choices=["shared", "each"], default="shared",
                    help="the task's properties once per member (SEND_MESSAGE_SHARED) or on every message")
    ap.add_argument("--no-profile", action="store_true", help="no py-spy: rates and CPU only")
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
        if args.no_profile:
            args.rate = 0
        t = asyncio.run(run(f"127.0.0.1:{port}", f"127.0.0.1:{admin}", broker.pid, args, workdir))
        n = args.members * args.messages
        print(f"properties: {args.properties}")
        for phase in ("send", "end", "end and keys"):
            seconds, cpu = t[phase]
            print(f"== {phase}: {n:,} messages in {seconds:.2f} s ({n / seconds:,.0f} msgs/s); "
                  f"broker event loop CPU {cpu / n * 1e6:.2f} us per message")
            if args.rate and phase != "end and keys":
                report(workdir / f"{phase}.raw", args.top)
    finally:
        broker.terminate()
        broker.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
