"""Brokers as subprocesses for the benchmarks (the same command users run), stopped on exit."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from txbroker.client.admin import AdminClient

TXBROKER = os.path.join(os.path.dirname(sys.executable), "txbroker")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, workdir: str, name: str, *args: str):
        self.name = name
        self.data = os.path.join(workdir, name)
        self.port, self.admin_port = free_port(), free_port()
        self.args = list(args)
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        return [TXBROKER, "broker", "--data-dir", self.data, "--listen", self.address,
                "--admin-listen", f"127.0.0.1:{self.admin_port}", "--broker-name", self.name,
                "--log-level", "WARNING", *self.args]

    def start(self) -> "Broker":
        self.proc = subprocess.Popen(self.command)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/readyz", timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"broker {self.name} did not become ready")

    @property
    def admin(self) -> AdminClient:
        return AdminClient(f"http://127.0.0.1:{self.admin_port}", timeout=30)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def workdir():
    d = tempfile.mkdtemp(prefix="txbroker-bench-")
    brokers: list[Broker] = []
    try:
        yield d, brokers
    finally:
        for b in brokers:
            b.stop()
        shutil.rmtree(d, ignore_errors=True)


def machine() -> dict:
    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    mem = ""
    with contextlib.suppress(OSError):
        mem = next((line.split(":", 1)[1].strip() for line in open("/proc/meminfo") if line.startswith("MemTotal")), "")
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "memory": mem, "python": platform.python_version(),
            "platform": platform.platform(), "loadavg": os.getloadavg()}


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def write_results(name: str, doc: dict) -> str:
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    with open(os.path.join(out_dir, f"{name}-latest.json"), "w") as f:
        json.dump(doc, f, indent=2)
    return path
