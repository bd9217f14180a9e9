"""One broker under test: a real `txbroker broker` process in its own network namespace, on a
filesystem of its own, with the faults of its machine (clock, disk, files, power) at hand.

    data   <work>/b<i>        a tmpfs (DISK_MB); when the schedule cuts power, chaos/lazyfs.py
                              mounted over it (writes not fsynced are what a power loss drops)
    wire   <ip>:10911         the client port; with delays on, chaos/proxy.py listens there and the
                              broker behind it on <ip>:20911 (every connection passes the proxy)
    clock  <work>/b<i>.clock  libfaketime's offset file: the broker's wall clock, skewable

A broker that dies is started again by the schedule's kubelet loop (schedule.py) with the role the
controller's status gives it, as a kubelet restarts a container with its pod's spec.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

from txbroker_operator import constants as c

from chaos.lazyfs import LazyFS
from chaos.net import Network, in_ns

TXBROKER = str(Path(sys.executable).with_name("txbroker"))
BROKER_PORT = 20911  # where the broker listens when the proxy holds the client port
# Fast timers, so a schedule of a minute sees check-back, retention, job expiry and scrubs at work.
# Checks count whether or not a producer is connected (as RocketMQ's do), so the check budget
# (40 x 0.5 s) outlasts any one fault's hold plus a failover: at 15 checks, a master cut off from
# its clients for 4.6 s and the failover after it parked 4 transactions their producers would have
# decided (seed 46), the harness's own timers, not what a user runs (60 s x 15).
FLAGS = ("--replication-timeout-ms", "1000", "--replication-heartbeat-ms", "200", "--check-interval-ms", "500",
         "--check-max", "40", "--transaction-timeout-ms", "300", "--log-level", os.environ.get("CHAOS_BROKER_LOG_LEVEL", "INFO"),
         "--message-delay-level", "1s 1s 1s 2s 2s 2s 3s 3s 3s 4s 4s 4s 5s 5s 5s 6s 6s 6s",
         "--await-role-confirmation")  # as the operator's pods: a restarted master waits for its controller
# A broker's wall clock is skewed through libfaketime (chaos/setup.sh installs it): the offset is
# read from a file the nemesis rewrites; monotonic clocks stay true, as a skewed NTP would leave them.
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
DISK_MB = 384  # each broker's data directory is a tmpfs of this size, so the nemesis can fill it
STORE = "store"  # the data directory inside the broker's filesystem


# The schedule's mode: SYNC (replication and flush), ASYNC (both), ASYNC_FLUSH (SYNC replication,
# the log fsynced every --flush-interval-ms: what only a whole group's power cut can lose).
MODES = ("SYNC", "ASYNC", "ASYNC_FLUSH")


def replication_of(mode: str) -> str:
    return "ASYNC" if mode == "ASYNC" else "SYNC"


def flush_of(mode: str) -> str:
    return "SYNC" if mode == "SYNC" else "ASYNC"


def retention_flags(retention_s: float) -> tuple[str, ...]:
    """Records older than `retention_s` deleted (their lineage kept), decided jobs expiring after
    twice that, checked every tenth of it; every record read back (checksums) every 5 s."""
    if not retention_s:
        return ("--scrub-interval-ms", "5000")
    ms = int(retention_s * 1000)
    return ("--retention-ms", str(ms), "--retention-check-interval-ms", str(max(ms // 10, 500)),
            "--job-retention-ms", str(2 * ms), "--scrub-interval-ms", "5000")


class BrokerProc:
    def __init__(self, index: int, group: str, net: Network, workdir: Path, mode: str, *, retention_s: float = 0,
                 proxied: bool = False, route_file: Path | None = None, lazy: bool = False):
        self.index = index
        self.group = group
        self.name = f"b{index}"
        self.net = net
        self.ns = net.brokers[index]
        self.ip = net.ips[index]
        self.mode = mode  # one of MODES
        self.retention_s = retention_s
        self.proxied = proxied
        self.route_file = route_file
        self.root = workdir / self.name
        self.log_path = workdir / f"{self.name}.log"
        self.clock_file = workdir / f"{self.name}.clock"
        self.delay_file = workdir / f"{self.name}.delay"
        self.proc: subprocess.Popen | None = None
        self.proxy: subprocess.Popen | None = None
        self.lazy = lazy  # on lazyfs: a power loss can be cut
        self.disk: LazyFS | None = None
        self.paused = False
        self.starts = 0
        self.exits: list[int] = []  # the exit codes of its past processes (71: damaged store, 72: needs a seed)
        self.down_until = 0.0  # killed: restarted from then on (the kubelet's back-off)
        self.removed = False  # its group left the cluster: never restarted

    @property
    def address(self) -> str:
        return f"{self.ip}:{c.CLIENT_PORT}"

    @property
    def data(self) -> Path:
        return self.root / STORE

    def mount(self) -> None:
        self.root.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", f"txbc-{self.name}", str(self.root)],
                       check=True)
        if self.lazy:
            self.disk = LazyFS(self.root, self.root, control=self.log_path.with_suffix(".lazyfs"),
                               log_path=self.log_path.with_suffix(".lazyfs.log")).start()
        self.skew_clock(0)
        self.delay(0, 0)
        if self.proxied:
            with open(self.log_path.with_suffix(".proxy.log"), "ab") as out:
                self.proxy = subprocess.Popen(in_ns(self.ns, sys.executable, "-m", "chaos.proxy", "--listen",
                                                    self.address, "--upstream", f"{self.ip}:{BROKER_PORT}",
                                                    "--control", str(self.delay_file)),
                                              stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1])

    def unmount(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.kill()
            self.proxy.wait(10)
        if self.disk is not None:
            self.disk.stop()
        subprocess.run(["umount", "-l", str(self.root)], check=False, capture_output=True)

    def start(self, master: str | None) -> None:
        role = ["--master", master, "--role", "slave"] if master else []
        listen = f"{self.ip}:{BROKER_PORT}" if self.proxied else self.address
        group = ["--group", self.group, "--cluster-file", str(self.route_file)] if self.route_file else []
        cmd = in_ns(self.ns, TXBROKER, "broker", "--data-dir", str(self.data), "--broker-name", self.name,
                    "--listen", listen, "--admin-listen", f"{self.ip}:{c.ADMIN_PORT}", *role, *group,
                    "--replication-mode", replication_of(self.mode), "--flush-disk-type", flush_of(self.mode), *FLAGS,
                    *retention_flags(self.retention_s))
        env = dict(os.environ, LD_PRELOAD=FAKETIME, FAKETIME_TIMESTAMP_FILE=str(self.clock_file),
                   FAKETIME_CACHE_DURATION="1", DONT_FAKE_MONOTONIC="1")
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.paused = False
        self.starts += 1

    # ---- faults of the machine, not the process ------------------------------------------------

    def skew_clock(self, seconds: int) -> None:
        """The broker's wall clock runs `seconds` off from now on (0: true again)."""
        self.clock_file.write_text(f"{seconds:+d}\n")

    def delay(self, clients_ms: int, peers_ms: int) -> None:
        """What the proxy adds to connections from clients and from other brokers (0: nothing)."""
        tmp = self.delay_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"clients_ms": clients_ms, "peers_ms": peers_ms}))
        os.replace(tmp, self.delay_file)

    def fill_disk(self) -> None:
        """Fill the broker's filesystem to the last byte (a log that grew, another tenant)."""
        fd = os.open(self.root / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            st = os.statvfs(self.root)
            try:  # all but a little at once; the rest a page at a time
                os.posix_fallocate(fd, 0, max(st.f_bavail * st.f_frsize - (1 << 20), 1))
                os.lseek(fd, 0, os.SEEK_END)
            except OSError:
                pass
            try:
                while os.write(fd, b"\0" * 4096):
                    pass
            except OSError:
                pass
        finally:
            os.close(fd)

    def free_disk(self) -> None:
        (self.root / "filler").unlink(missing_ok=True)

    def damage(self, rnd: random.Random, how: str) -> list[str]:
        """Damage the store's files as a failing disk or a torn copy would: `bitflip` flips a few
        bits in table files (or the WAL when there is no table yet), `truncate` cuts a table file or
        the WAL short. Returns what it did, file by file."""
        files = [p for p in self.data.glob("*") if p.is_file() and p.stat().st_size > 0]
        tables = [p for p in files if p.suffix == ".sst"] or [p for p in files if p.suffix == ".log"]
        if not tables:
            return []
        done = []
        for victim in rnd.sample(tables, min(len(tables), rnd.randint(1, 2))):
            size = victim.stat().st_size
            with open(victim, "r+b") as f:
                if how == "truncate":
                    keep = rnd.randrange(0, size)
                    f.truncate(keep)
                    done.append(f"{victim.name}: cut from {size} to {keep} bytes")
                    continue
                flips = []
                for _ in range(rnd.randint(1, 8)):
                    at = rnd.randrange(size)
                    f.seek(at)
                    byte = f.read(1)[0]
                    f.seek(at)
                    f.write(bytes([byte ^ (1 << rnd.randrange(8))]))
                    flips.append(at)
                done.append(f"{victim.name}: bits flipped at {sorted(flips)}")
            os.sync()
        return done

    # ---- the process ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reap(self) -> int | None:
        """The exit code of a process that ended since the last look (recorded), else None."""
        if self.proc is not None and self.proc.poll() is not None and len(self.exits) < self.starts:
            self.exits.append(self.proc.returncode)
            return self.proc.returncode
        return None

    def signal(self, sig: int) -> None:
        if self.running:
            self.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                self.proc.wait(10)
            self.paused = sig == signal.SIGSTOP or (self.paused and sig != signal.SIGCONT)

    def stop(self) -> None:
        if self.running:
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def pod(self, role: str) -> dict:
        """What the operator would see of this broker's pod (`role`: the label it gave it)."""
        ready = self.running and not self.paused
        return {"metadata": {"name": self.name, "labels": {c.LABEL_INDEX: str(self.index), c.LABEL_ROLE: role}},
                "status": {"podIP": self.ip, "conditions": [{"type": "Ready", "status": str(ready)}]}}
