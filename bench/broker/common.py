"""Shared pieces: the machine description, a broker run as a real subprocess, CPU accounting.

CPU accounting reads /proc directly (no psutil): utime+stime of a process (all its threads) and of
single threads, so a run can say whether the broker's event-loop thread or the clients' were the
ones at 100 % of a core.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib import metadata
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent  # bench/
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
PYTHON = sys.executable
TXBROKER_CLI = str(Path(sys.executable).with_name("txbroker"))
CLK_TCK = os.sysconf("SC_CLK_TCK")

_live: set[subprocess.Popen] = set()


def _kill_leftovers() -> None:
    for p in list(_live):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


atexit.register(_kill_leftovers)


def track(p: subprocess.Popen) -> subprocess.Popen:
    """Remember a child so it is killed (by its own id) if the benchmark dies."""
    _live.add(p)
    return p


def untrack(p: subprocess.Popen) -> None:
    _live.discard(p)


# ---- the machine ---------------------------------------------------------------------------------

def machine_info() -> dict:
    model = ""
    mhz = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("cpu MHz") and not mhz:
                mhz = line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    pkgs = {}
    for name in ("txbroker", "rocksdict", "msgspec", "uvloop", "aiohttp", "prometheus-client"):
        try:
            pkgs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pkgs[name] = None
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "cpu_model": model,
        "cpu_mhz": mhz,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_impl": platform.python_implementation(),
        "packages": pkgs,
        "git_commit": _git_head(),
    }


def _git_head() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def loadavg() -> list[float]:
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return []


def host_speed_ms(iterations: int = 2_000_000) -> float:
    """Milliseconds a fixed pure-Python loop takes on one core, best of three: this machine's speed
    at the moment. The shared host's speed swings (the same loop took 0.8x-1.5x its median within
    one hour), so each run records it next to its figures; compare runs at similar speeds."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        x = 0
        for i in range(iterations):
            x += i
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 1)


def du(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- CPU accounting ------------------------------------------------------------------------------

def _stat_cpu(path: str) -> float:
    """utime+stime in seconds from a /proc/.../stat file (0 if gone)."""
    try:
        raw = open(path).read()
    except OSError:
        return 0.0
    rest = raw.rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def process_cpu(pid: int) -> float:
    return _stat_cpu(f"/proc/{pid}/stat")


def thread_cpu(pid: int, tid: int) -> float:
    return _stat_cpu(f"/proc/{pid}/task/{tid}/stat")


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (threads of one name summed)."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
        except OSError:
            continue
        name = re.sub(r"[:_-]?\d+$", "", name) or name
        if int(tid) == pid:
            name = "main"
        out[name] = out.get(name, 0.0) + thread_cpu(pid, int(tid))
    return out


def system_cpu() -> tuple[float, float, float]:
    """(busy, total, steal) seconds of the whole machine since boot, from /proc/stat."""
    f = open("/proc/stat").readline().split()[1:]
    vals = [int(x) for x in f]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    steal = vals[7] if len(vals) > 7 else 0
    return (total - idle - steal) / CLK_TCK, total / CLK_TCK, steal / CLK_TCK


class CpuSnapshot:
    """CPU of the broker (process, threads), of the client processes, and of the whole machine."""

    def __init__(self, broker_pid: int | None, client_pids: list[int]):
        self.t = time.monotonic()
        self.broker_pid = broker_pid
        self.broker = process_cpu(broker_pid) if broker_pid else 0.0
        self.broker_threads = threads_cpu(broker_pid) if broker_pid else {}
        self.clients = {pid: process_cpu(pid) for pid in client_pids}
        self.client_main = {pid: thread_cpu(pid, pid) for pid in client_pids}
        self.system_busy, self.system_total, self.system_steal = system_cpu()

    def since(self, earlier: "CpuSnapshot") -> dict:
        dt = self.t - earlier.t
        ncpu = os.cpu_count() or 1

        def pct(x: float) -> float:
            return round(100.0 * x / dt, 1) if dt > 0 else 0.0

        threads = {name: pct(v - earlier.broker_threads.get(name, 0.0))
                   for name, v in self.broker_threads.items()}
        broker = self.broker - earlier.broker
        clients = {pid: self.clients[pid] - earlier.clients.get(pid, 0.0) for pid in self.clients}
        client_main = {pid: self.client_main[pid] - earlier.client_main.get(pid, 0.0) for pid in self.client_main}
        busy = self.system_busy - earlier.system_busy
        total = self.system_total - earlier.system_total
        others = busy - broker - sum(clients.values())
        return {
            "seconds": round(dt, 3),
            "broker_pct": pct(broker),  # 100 = one core
            "broker_main_thread_pct": threads.get("main", 0.0),
            "broker_threads_pct": {k: v for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v >= 0.5},
            "clients_pct": pct(sum(clients.values())),
            "client_main_threads_pct": sorted((pct(v) for v in client_main.values()), reverse=True),
            "machine_busy_pct": round(100.0 * busy / total * ncpu, 1) if total > 0 else 0.0,  # of ncpu*100
            "others_pct": pct(max(others, 0.0)),  # everything else on the (shared) machine
            "steal_pct": pct(self.system_steal - earlier.system_steal),  # taken by the hypervisor
        }


def saturation(cpu: dict) -> str:
    """Which side ran out of CPU, judged from the single event-loop threads (one core each)."""
    b = cpu.get("broker_main_thread_pct", 0.0)
    cl = cpu.get("client_main_threads_pct") or [0.0]
    notes = []
    if b >= 85:
        notes.append(f"broker loop {b:.0f}%")
    if max(cl) >= 85:
        notes.append(f"client loop {max(cl):.0f}%")
    if cpu.get("machine_busy_pct", 0) >= 180:
        notes.append(f"machine {cpu['machine_busy_pct']:.0f}%/200")
    if not notes:
        return "none (latency-bound)"
    return ", ".join(notes)


# ---- message bodies ------------------------------------------------------------------------------

class RandomBodies:
    """Incompressible bodies, each a different slice of a random buffer, so RocksDB's block
    compression cannot shrink the store (a repeated body would compress within a block)."""

    def __init__(self, size: int, pool: int = 8 * 1024 * 1024):
        import random
        self.size = size
        self._buf = os.urandom(pool + size)
        self._rand = random.Random(1234).randrange
        self._pool = pool

    def next(self) -> bytes:
        o = self._rand(self._pool)
        return self._buf[o:o + self.size]


# ---- statistics ----------------------------------------------------------------------------------

def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    v = sorted(values)
    n = len(v)

    def q(p: float) -> float:
        return v[min(n - 1, max(0, int(round(p * (n - 1)))))]

    return {"n": n, "p50": q(0.50), "p90": q(0.90), "p99": q(0.99), "p999": q(0.999), "max": v[-1],
            "mean": sum(v) / n}


def spread(values: list[float]) -> dict:
    """Best, worst and median of repeated runs of one figure."""
    if not values:
        return {}
    v = sorted(values)
    return {"runs": [round(x, 3) for x in values], "min": v[0], "max": v[-1], "median": v[len(v) // 2]}


# ---- a broker as a subprocess --------------------------------------------------------------------

class BrokerProcess:
    """`txbroker broker ...` in its own process group, on free ports, with a fresh data dir."""

    def __init__(self, flush: str = "ASYNC", data_dir: str | None = None, extra: list[str] | None = None,
                 log_level: str = "WARNING"):
        self.flush = flush
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="txbroker-bench-")
        self.port = free_port()
        self.admin_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"
        self.cmd = [TXBROKER_CLI, "broker", "--data-dir", self.data_dir, "--listen", self.address,
                    "--admin-listen", f"127.0.0.1:{self.admin_port}", "--flush-disk-type", flush,
                    "--log-level", log_level] + (extra or [])
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.rstrip("/") + ".log"
        self.ready_seconds = 0.0

    def start(self, timeout: float = 120.0) -> "BrokerProcess":
        t0 = time.monotonic()
        self._log = open(self.log_path, "wb")
        self.proc = track(subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.tail_log()}")
            try:
                with self.open_admin("/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"broker not ready after {timeout}s: {self.tail_log()}")
            time.sleep(0.02)
        self.ready_seconds = time.monotonic() - t0
        return self

    def open_admin(self, path: str, data: bytes | None = None, timeout: float = 10):
        """An admin-API request (subclasses add TLS and credentials)."""
        req = urllib.request.Request(self.admin + path, data=data, method="POST" if data else "GET",
                                     headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=timeout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail_log(self, n: int = 2000) -> str:
        try:
            return Path(self.log_path).read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def create_topic(self, name: str, queues: int) -> None:
        req = urllib.request.Request(self.admin + "/api/v1/topics", method="POST",
                                     data=json.dumps({"name": name, "queues": queues}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.admin + "/metrics", timeout=10) as r:
            return r.read().decode()

    def flush_stats(self) -> dict:
        """Group-commit figures from /metrics: writes, records per write, seconds per write."""
        try:
            text = self.metrics_text()
        except OSError:
            return {}
        vals = {}
        for name in ("txbroker_flush_batch_records_count", "txbroker_flush_batch_records_sum",
                     "txbroker_flush_seconds_sum", "txbroker_flush_seconds_count"):
            m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
            vals[name] = float(m.group(1)) if m else 0.0
        writes = vals["txbroker_flush_batch_records_count"]
        if not writes:
            return {"writes": 0}
        return {"writes": int(writes),
                "records_per_write": round(vals["txbroker_flush_batch_records_sum"] / writes, 1),
                "ms_per_write": round(1000 * vals["txbroker_flush_seconds_sum"] / writes, 3)}

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        rc = None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                rc = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                rc = self.proc.wait()
        else:
            rc = self.proc.returncode
        untrack(self.proc)
        self._log.close()
        return rc

    def cleanup(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            try:
                os.unlink(self.log_path)
            except OSError:
                pass

    def __enter__(self) -> "BrokerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.cleanup()
