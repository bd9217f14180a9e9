"""The brokers under test (real `txbroker broker` processes, each in its own network namespace) and
the controller that fails over between them with the operator's own decisions.

The controller is the operator's reconcile reduced to what failover needs: every pass it observes
the brokers (`observe.observe` over pod-like records: a broker is "ready" while its process runs and
is not paused, as a kubelet probe would see it), keeps the status entries (`status.broker_entries`),
and when the master has not served for the grace period asks `failover.decide_failover`, then
promotes and demotes through the operator's admin client (`brokers.Access`). A broker that died is
started again (the kubelet's restart) as a slave of the current master.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from txbroker_operator import brokers, constants as c, failover, observe, status

from chaos.net import Network, in_ns

log = logging.getLogger("chaos")
TXBROKER = str(Path(sys.executable).with_name("txbroker"))
FLAGS = ("--replication-timeout-ms", "1000", "--replication-heartbeat-ms", "200", "--check-interval-ms", "500",
         "--transaction-timeout-ms", "300", "--log-level", "WARNING")
GRACE_SECONDS = 2.0
# A broker's wall clock is skewed through libfaketime (chaos/setup.sh installs it): the offset is
# read from a file the nemesis rewrites; monotonic clocks stay true, as a skewed NTP would leave them.
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
DISK_MB = 384  # each broker's data directory is a tmpfs of this size, so the nemesis can fill it


class BrokerProc:
    def __init__(self, index: int, net: Network, workdir: Path, mode: str):
        self.index = index
        self.name = f"b{index}"
        self.net = net
        self.ip = net.ips[index]
        self.mode = mode  # SYNC or ASYNC: replication and flush
        self.data = workdir / self.name
        self.log_path = workdir / f"{self.name}.log"
        self.clock_file = workdir / f"{self.name}.clock"
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.starts = 0
        self.down_until = 0.0  # killed: the controller restarts it from then on (the kubelet's back-off)

    @property
    def address(self) -> str:
        return f"{self.ip}:{c.CLIENT_PORT}"

    def mount(self) -> None:
        self.data.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", f"txbc-{self.name}", str(self.data)],
                       check=True)
        self.skew_clock(0)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.data)], check=False, capture_output=True)

    def start(self, master: str | None) -> None:
        role = ["--master", master, "--role", "slave"] if master else []
        cmd = in_ns(self.net.brokers[self.index], TXBROKER, "broker", "--data-dir", str(self.data / "store"),
                    "--broker-name", self.name, "--listen", self.address,
                    "--admin-listen", f"{self.ip}:{c.ADMIN_PORT}", *role, "--replication-mode", self.mode,
                    "--flush-disk-type", self.mode, *FLAGS)
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

    def fill_disk(self) -> None:
        """Fill the broker's filesystem to the last byte (a log that grew, another tenant)."""
        fd = os.open(self.data / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            st = os.statvfs(self.data)
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
        (self.data / "filler").unlink(missing_ok=True)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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


class Controller:
    def __init__(self, procs: list[BrokerProc]):
        self.procs = {p.name: p for p in procs}
        self.spec = {"replicas": len(procs), "replication": procs[0].mode,
                     "failover": {"gracePeriodSeconds": GRACE_SECONDS}}
        self.status: dict = {"master": "b0", "epoch": 1, "brokers": []}
        self.down_since: float | None = None
        self.failovers: list[dict] = []  # (time, from, to, epoch, reason)
        self.blocked: dict[str, int] = {}
        self.access = brokers.PLAIN
        self.last_look: dict = {}  # the members the last pass observed

    @property
    def master(self) -> str:
        return self.status["master"]

    def master_address(self) -> str:
        return self.procs[self.master].address

    def pods(self) -> list[dict]:
        return [p.pod(failover.role_for(p.name, self.master)) for p in self.procs.values()]

    def pass_once(self, restart_dead: bool = True) -> None:
        if restart_dead:
            for p in self.procs.values():
                if p.proc is not None and not p.running and time.monotonic() >= p.down_until:
                    log.info("restarting %s (exit %s) as a slave of %s", p.name, p.proc.returncode, self.master)
                    p.start(self.master_address() if p.name != self.master else None)
        looked = time.monotonic()
        members = self.last_look = observe.observe(self.pods(), self.access)
        self.status["brokers"] = status.broker_entries(members, self.master, self.status["brokers"])
        if failover.master_down_reason(members, self.master) == "":
            self.down_since = None
            self._demote_strays(members)
            return
        now = time.monotonic()
        self.down_since = self.down_since or looked  # as the operator: since the look that found it down began
        decision = failover.decide_failover(self.spec, self.status, members, self.master, now - self.down_since)
        if isinstance(decision, failover.Blocked):
            self.blocked[decision.reason] = self.blocked.get(decision.reason, 0) + 1
            return
        if decision is None:
            return
        old = self.master
        new = self.procs[decision.successor]
        try:  # as the operator's take_over: the others follow the successor first, then it is promoted
            for m in failover.fence_before_promotion(members, new.name):
                try:
                    self.access.demote(m.ip, new.address, decision.epoch)
                except (brokers.Unreachable, brokers.BrokerError) as e:
                    log.info("%s does not follow %s yet: %s", m.name, new.name, e)
            self.access.promote(new.ip, decision.epoch)
        except (brokers.Unreachable, brokers.BrokerError) as e:
            log.warning("promotion of %s failed: %s", new.name, e)
            return
        self.status.update(master=new.name, epoch=decision.epoch)
        self.down_since = None
        self.failovers.append({"at": time.monotonic(), "from": old, "to": new.name, "epoch": decision.epoch,
                               "message": decision.message, "old_master_paused": self.procs[old].paused})
        log.warning("failover: %s", decision.message)
        self._demote_strays(observe.observe(self.pods(), self.access))

    def _demote_strays(self, members: dict) -> None:
        """Every broker but the master follows the master at its epoch."""
        epoch, address = self.status["epoch"], self.master_address()
        for m in members.values():
            if m.name == self.master or m.info is None:
                continue
            if m.info.is_master or m.info.fenced_by or (m.info.master and m.info.master != address):
                try:
                    self.access.demote(self.procs[m.name].ip, address, epoch)
                except (brokers.Unreachable, brokers.BrokerError) as e:
                    log.info("demoting %s: %s", m.name, e)


def start_cluster(net: Network, workdir: Path, mode: str = "SYNC", size: int = 3) -> tuple[list[BrokerProc], Controller]:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    procs = [BrokerProc(i, net, workdir, mode) for i in range(size)]
    for p in procs:
        p.mount()
    procs[0].start(None)
    for p in procs[1:]:
        p.start(procs[0].address)
    ctl = Controller(procs)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = brokers.PLAIN.try_info(procs[0].ip)
        if info and sum(1 for s in info.slaves if s.get("in_sync")) == size - 1:
            return procs, ctl
        time.sleep(0.1)
    raise RuntimeError("the cluster did not come up: " + "; ".join(p.log_path.read_text()[-500:] for p in procs))
