"""The faults, by family, as a schedule injects and heals them. Each fault picks its group and broker
from the seed when it starts (the master as the controller's status names it then).

  process      kill -9 of a master or slave (restarted at once, or after a back-off longer than the
               failover grace), SIGSTOP/SIGCONT
  network      a master partitioned from its slaves, a slave cut from its master (in, out or both),
               a master cut from the clients and controllers
  clock        a broker's wall clock skewed 2 s to 120 s either way
  disk         a broker's filesystem filled to the last byte
  links        packet loss (iptables' statistic match) on a master's replication or client links, or
               on one slave's; delay (chaos/proxy.py) on a master's replication or client traffic
  power        power cut: a broker, or every broker of a group at once, loses what it did not fsync
               (chaos/lazyfs.py) and starts again
  corruption   bit flips or truncation in a minority's table files and log: a slave's (stopped; or
               running, for the scrub to find, else the next start), or a master's (then deposed):
               detected, never served, the broker re-seeded from its master
  membership   a group added during load; a group drained and removed once the operator's rule lets
               it go
  operator     a group's controller (the operator's failover) killed: at a random moment, or in the
               middle of a failover it is carrying out (after saving its decision, or after the
               other brokers follow the successor, before the promotion)
  backup       a backup of a group's slave with the real CLI (chaos/backup.py), in the background,
               0-3 s after it is drawn: while the next faults are held and the workload runs. Not a
               fault of the machine but an operator's act that must hold up under them (a refusal,
               the slave not in sync, is an outcome; restored and checked at the schedule's end)
"""

from __future__ import annotations

import random
import signal
import threading
import time

from txbroker_operator import brokers

from chaos import backup
from chaos.cluster import Cluster, Group
from chaos.net import HUB_IP

FAMILIES = {
    "process": ("kill-master", "kill-slave", "pause-master", "pause-slave"),
    "network": ("partition-master", "partition-slave", "isolate-master-from-clients"),
    "clock": ("skew-master-clock", "skew-slave-clock"),
    "disk": ("fill-master-disk", "fill-slave-disk"),
    "links": ("lossy-replication", "lossy-clients", "lossy-slave", "slow-replication", "slow-clients"),
    "power": ("power-loss-broker", "power-loss-group"),
    "corruption": ("corrupt-slave", "corrupt-running-slave", "corrupt-master"),
    "membership": ("add-group", "drain-group"),
    "operator": ("kill-controller", "kill-controller-mid-failover"),
    "backup": ("backup-slave",),
}
INSTANT = {"add-group", "drain-group", "corrupt-slave", "corrupt-master", "backup-slave"}
MAX_BACKUPS = 3  # per schedule: each is restored and read at the end


def family_of(kind: str) -> str:
    return next(f for f, kinds in FAMILIES.items() if kind in kinds)


class Nemesis:
    def __init__(self, rnd: random.Random, cluster: Cluster, hows: list[str] | None = None):
        self.rnd, self.cluster = rnd, cluster
        self.hows = hows or []  # the damage of the next stopped brokers' corruption, before a random one
        self.events: list[dict] = []
        self.draining: Group | None = None
        self.added = False
        self.backups: list[threading.Thread] = []
        self.damaged: dict[str, str] = {}  # broker corrupted and not yet whole again -> its group

    def _group(self, whole_only: bool = False) -> Group:
        live = [g for g in self.cluster.live_groups if g.state == "active"] or self.cluster.live_groups
        if whole_only:
            live = [g for g in live if self._whole(g)]
        return self.rnd.choice(live)

    def _whole(self, g: Group) -> bool:
        """Every broker of `g` holds a whole copy: none was corrupted that is not since back in sync
        (re-seeded) or serving as master. Corruption strikes a minority, so one broker of a group
        at a time: two damaged copies of a group of two is losing the group, not a fault it must
        survive."""
        mine = [name for name, group in self.damaged.items() if group == g.name]
        if not mine:
            return True
        info = brokers.PLAIN.try_info(g.master.ip)
        whole = {s["name"] for s in info.slaves if s.get("in_sync")} if info else set()
        if info and g.master.running:
            whole.add(g.master.name)
        for name in mine:
            if name in whole:
                del self.damaged[name]
        return not any(group == g.name for group in self.damaged.values())

    def _slave(self, g: Group):
        return self.rnd.choice([p for p in g.procs if p is not g.master])

    def possible(self, kind: str) -> bool:
        if kind == "add-group":
            return not self.added
        if kind == "drain-group":  # one at a time, and at least one active group stays
            return self.draining is None and sum(g.state == "active" for g in self.cluster.live_groups) >= 2
        if kind.startswith("power"):
            return all(p.lazy for p in self.cluster.procs)
        if kind == "backup-slave":  # one at a time
            return len(self.backups) < MAX_BACKUPS and not any(t.is_alive() for t in self.backups)
        if kind.startswith("corrupt"):
            return any(self._whole(g) for g in self.cluster.live_groups if g.state == "active")
        return True

    def inject(self, kind: str) -> dict:
        g = self._group(whole_only=kind.startswith("corrupt"))
        on_master = "master" in kind or kind.startswith("kill-controller") or kind in (
            "slow-replication", "slow-clients", "lossy-replication", "lossy-clients")
        target = g.master if on_master else self._slave(g)
        ev = {"kind": kind, "family": family_of(kind), "group": g.name, "target": target.name,
              "start": time.monotonic()}
        net = self.cluster.net
        others = [p for p in g.procs if p is not target]
        if kind.startswith("kill-controller"):
            ev["target"] = f"{g.name}-controller"
            if kind == "kill-controller-mid-failover":
                # the controller restarted to crash at a step of the failover the master's kill causes
                ev["crash_at"] = self.rnd.choice(["saved", "fenced"])
                self.cluster.kill_controller(g)
                self.cluster.start_controller(g, crash_at=ev["crash_at"])
                ev["master"] = target.name
                target.down_until = time.monotonic() + self.rnd.uniform(3.0, 6.0)
                target.signal(signal.SIGKILL)
            else:
                self.cluster.kill_controller(g)
            ev["restart_after_s"] = round(self.rnd.uniform(0.0, 3.0), 2)
        elif kind.startswith("kill"):
            # restarted by the kubelet loop: at once, or after a back-off longer than the failover
            # grace period (then the master fails over first)
            ev["restart_after_s"] = round(self.rnd.choice([0.0, self.rnd.uniform(3.0, 6.0)]), 2)
            target.down_until = time.monotonic() + ev["restart_after_s"]
            target.signal(signal.SIGKILL)
        elif kind.startswith("pause"):
            target.signal(signal.SIGSTOP)
        elif kind == "partition-master":
            for p in others:
                net.cut(target.index, p.ip, "both")
        elif kind == "partition-slave":
            ev["direction"] = self.rnd.choice(["in", "out", "both"])
            net.cut(target.index, g.master.ip, ev["direction"])
        elif kind == "isolate-master-from-clients":
            net.cut(target.index, HUB_IP, "both")
        elif kind.startswith("skew"):  # a few seconds either way, or past the check and job timeouts
            ev["skew_s"] = self.rnd.choice([-1, 1]) * self.rnd.choice([2, 5, 30, 120])
            target.skew_clock(ev["skew_s"])
        elif kind.startswith("fill"):
            target.fill_disk()
        elif kind.startswith("lossy"):
            ev["loss"] = round(self.rnd.choice([0.05, 0.2, 0.4]), 2)
            peers = [HUB_IP] if kind == "lossy-clients" else [p.ip for p in others] if kind == "lossy-replication" \
                else [g.master.ip]
            net.lose(target.index, peers, ev["loss"])
        elif kind.startswith("slow"):
            ev["delay_ms"] = self.rnd.choice([50, 200, 800, 2000])
            target.delay(ev["delay_ms"] if kind == "slow-clients" else 0, ev["delay_ms"] if kind == "slow-replication" else 0)
        elif kind == "power-loss-broker":
            ev["restart_after_s"] = round(self.rnd.choice([0.0, self.rnd.uniform(3.0, 6.0)]), 2)
            ev["dropped_bytes"] = self._power_off([target], ev["restart_after_s"])
        elif kind == "power-loss-group":
            ev["target"] = "+".join(p.name for p in g.procs)
            ev["restart_after_s"] = round(self.rnd.uniform(0.5, 3.0), 2)
            ev["dropped_bytes"] = self._power_off(g.procs, ev["restart_after_s"])
        elif kind.startswith("corrupt"):
            self.damaged[target.name] = g.name
            ev["how"] = self.rnd.choice(["bitflip", "truncate"])
            if kind != "corrupt-running-slave" and self.hows:
                ev["how"] = self.hows.pop(0)
            if kind == "corrupt-running-slave":
                ev["how"] = "bitflip"  # a running broker's files cut short are its own doing, not the disk's
                ev["damage"] = target.damage(self.rnd, ev["how"])
            else:
                ev["restart_after_s"] = 0.0 if kind == "corrupt-slave" else round(self.rnd.uniform(3.0, 6.0), 2)
                target.down_until = time.monotonic() + 3600  # not before the damage is done
                target.signal(signal.SIGKILL)
                ev["damage"] = target.damage(self.rnd, ev["how"])
                target.down_until = time.monotonic() + ev["restart_after_s"]
        elif kind == "add-group":
            self.added = True
            name = f"g{len(self.cluster.groups)}"
            ev.update(group=name, target=name)
            self.cluster.add_group(name, 2)
        elif kind == "drain-group":
            ev["target"] = g.name
            self.draining = g
            self.cluster.drain(g)
        elif kind == "backup-slave":
            ev["after_s"] = round(self.rnd.uniform(0.0, 3.0), 2)
            dest = self.cluster.workdir / "backups" / f"{len(self.backups)}-{g.name}-{target.name}"
            t = threading.Thread(target=self._backup, args=(ev, target.ip, dest), daemon=True)
            self.backups.append(t)
            t.start()
        self.events.append(ev)
        return ev

    def _backup(self, ev: dict, ip: str, dest) -> None:
        """Later (so the next fault is on meanwhile): the backup, its outcome kept in the event."""
        time.sleep(ev["after_s"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        ev["backup"] = backup.take(f"http://{ip}:10912", dest)

    def wait_backups(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self.backups:
            t.join(max(deadline - time.monotonic(), 0))

    def _power_off(self, procs, restart_after: float) -> dict[str, int]:
        """Every write these brokers did not fsync is gone, as after a power cut: the processes die
        at once, their filesystems drop what was not synced, and they start again later. Returns
        the bytes each lost."""
        for p in procs:
            p.down_until = time.monotonic() + 3600
            p.signal(signal.SIGKILL)
        dropped = {p.name: p.disk.power_loss().get("bytes", 0) for p in procs}
        for p in procs:
            p.down_until = time.monotonic() + restart_after
        return dropped

    def heal(self, ev: dict) -> None:
        g = self.cluster.groups[ev["group"]]
        kind = ev["kind"]
        if kind.startswith("kill-controller"):
            if kind == "kill-controller-mid-failover":  # it dies at its step of the failover, or did not get there
                deadline = time.monotonic() + 20
                while g.controller.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                ev["crashed"] = g.controller.poll() == 137
            time.sleep(ev["restart_after_s"])  # then a new leader takes over
            self.cluster.kill_controller(g)
            if g.state != "removed":
                self.cluster.start_controller(g)
        elif kind == "corrupt-running-slave":
            # the scrub may have found it (the broker stopped, exit 71); else the machine reboots
            target = g.by_name(ev["target"])
            ev["found_by"] = "scrub" if not target.running else "restart"
            target.down_until = time.monotonic()
            target.signal(signal.SIGKILL)
        elif kind in ("add-group", "drain-group", "backup-slave") or kind.startswith(("kill", "power", "corrupt")):
            pass  # the kubelet loop restarts; a drained group is removed by the schedule's loop
        else:
            target = g.by_name(ev["target"])
            if kind.startswith("pause"):
                target.signal(signal.SIGCONT)
            elif "partition" in kind or "isolate" in kind or kind.startswith("lossy"):
                self.cluster.net.heal(target.index)
            elif kind.startswith("skew"):
                target.skew_clock(0)
            elif kind.startswith("fill"):
                target.free_disk()
            elif kind.startswith("slow"):
                target.delay(0, 0)
        ev["healed"] = time.monotonic()

    def heal_all(self) -> None:
        for p in self.cluster.procs:
            if p.paused:
                p.signal(signal.SIGCONT)
            p.skew_clock(0)
            p.free_disk()
            p.delay(0, 0)
        self.cluster.net.heal()
        for g in self.cluster.live_groups:
            if g.controller is None or g.controller.poll() is not None:
                self.cluster.start_controller(g)
