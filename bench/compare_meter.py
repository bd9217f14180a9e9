"""How loaded the machine was during one case of bench/compare.py, measured the same way for both systems.

A `Meter` is started before a case and stopped after it. It records the 1/5/15-minute load averages
before and after, and CPU over the case from /proc: everything this benchmark started (the process
tree below this process: brokers, JVMs, client processes, also those that exited and were reaped
during the case) and everything else on the machine ("others": other engineers' builds and tests).
100 = one core; the machine has `os.cpu_count()` of them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "broker"))
from common import CLK_TCK, loadavg, system_cpu  # noqa: E402  (bench/broker/common.py)


def _proc_times() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, utime+stime+cutime+cstime in seconds) for every readable process."""
    out: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = open(f"/proc/{name}/stat").read()
        except OSError:
            continue
        rest = raw.rsplit(")", 1)[1].split()
        # fields after the command: state ppid ... utime(11) stime(12) cutime(13) cstime(14)
        out[int(name)] = (int(rest[1]), sum(int(x) for x in rest[11:15]) / CLK_TCK)
    return out


def own_tree_cpu(root: int | None = None) -> float:
    """CPU seconds of `root` (default: this process) and all its live descendants, including what
    their reaped children used (cutime/cstime), so a child that exits during a case still counts."""
    root = root or os.getpid()
    procs = _proc_times()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        if pid in procs:
            total += procs[pid][1]
        stack.extend(children.get(pid, ()))
    return total


def process_cpu(pid: int) -> float:
    try:
        rest = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


class Meter:
    """Load averages and CPU shares over one case. `server_pid`: the broker process (txbroker's
    broker, or RocketMQ's broker JVM) whose own CPU is reported separately."""

    def __init__(self, server_pid: int | None = None):
        self.server_pid = server_pid
        self.loadavg_before = loadavg()
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.t0 = time.monotonic()
        self.own0 = own_tree_cpu()
        self.server0 = process_cpu(server_pid) if server_pid else 0.0
        self.busy0, self.total0, _ = system_cpu()

    def stop(self) -> dict:
        dt = time.monotonic() - self.t0
        own = own_tree_cpu() - self.own0
        busy1, total1, _ = system_cpu()
        busy = busy1 - self.busy0
        ncpu = os.cpu_count() or 1
        # /proc/stat counts jiffies of all CPUs: busy/total * ncpu = cores busy on average
        cores_busy = busy / (total1 - self.total0) * ncpu if total1 > self.total0 else 0.0

        def pct(x: float) -> float:
            return round(100.0 * x / dt, 1) if dt > 0 else 0.0

        out = {
            "started_utc": self.started,
            "ended_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(dt, 1),
            "loadavg_before": self.loadavg_before,
            "loadavg_after": loadavg(),
            "machine_busy_pct": round(100.0 * cores_busy, 1),  # of ncpu * 100
            "this_benchmark_pct": pct(own),
            "others_pct": round(max(0.0, 100.0 * cores_busy - pct(own)), 1),
        }
        if self.server_pid:
            out["server_pct"] = pct(process_cpu(self.server_pid) - self.server0)
        return out
