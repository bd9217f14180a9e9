"""The cluster under test: broker groups (1 master + 2 slaves each, SYNC replication and flush by
default), the route file every broker reads, a controller process per group (chaos/controller.py:
the operator's failover), and a kubelet loop that restarts dead brokers and reports readiness.

Membership changes as the operator makes them (docs/broker-groups.md, "Scaling"): a group is added
by listing it in a new route version and starting its brokers; a group is removed by listing it
draining, waiting until the operator's own rule (`scaling.decide_removal`, on its master's
`/api/v1/drain` and every other master's `waiting_on`) lets it go, then dropping it from the route and
stopping its brokers and controller.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from txbroker_operator import brokers, scaling

from chaos.broker import BrokerProc, flush_of, replication_of
from chaos.controller import read_state, write_state
from chaos.net import Network

log = logging.getLogger("chaos")
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Group:
    name: str
    procs: list[BrokerProc]
    status_path: Path
    pods_path: Path
    state: str = "active"  # active | draining | removed
    controller: subprocess.Popen | None = None
    controller_starts: int = 0
    controller_log: Path | None = None
    drain_version: int = 0
    events: list[dict] = field(default_factory=list)

    @property
    def status(self) -> dict:
        return read_state(self.status_path)

    @property
    def master(self) -> BrokerProc:
        name = self.status.get("master") or self.procs[0].name
        return next(p for p in self.procs if p.name == name)

    def by_name(self, name: str) -> BrokerProc:
        return next(p for p in self.procs if p.name == name)

    @property
    def addresses(self) -> list[str]:
        return [p.address for p in self.procs]


class Cluster:
    def __init__(self, net: Network, workdir: Path, mode: str, *, retention_s: float, proxied: bool, lazy: bool):
        self.net, self.workdir, self.mode = net, workdir, mode
        self.retention_s, self.proxied, self.lazy = retention_s, proxied, lazy
        self.route_file = workdir / "route.yaml"
        self.route_version = 0
        self.groups: dict[str, Group] = {}
        self.next_index = 0
        self.route_changes: list[dict] = []  # (time, version, groups and states) of every route written

    # ---- the route -------------------------------------------------------------------------------

    def write_route(self) -> None:
        self.route_version += 1
        doc = {"cluster": "chaos", "version": self.route_version,
               "groups": [{"name": g.name, "addresses": g.addresses, "state": g.state}
                          for g in self.groups.values() if g.state != "removed"]}
        tmp = self.route_file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(self.route_file)
        self.route_changes.append({"at": time.monotonic(), "version": self.route_version,
                                   "groups": {g["name"]: g["state"] for g in doc["groups"]}})

    @property
    def live_groups(self) -> list[Group]:
        return [g for g in self.groups.values() if g.state != "removed"]

    @property
    def procs(self) -> list[BrokerProc]:
        return [p for g in self.live_groups for p in g.procs]

    def bootstrap(self) -> list[str]:
        return [p.address for p in self.procs]

    # ---- groups ----------------------------------------------------------------------------------

    def make_group(self, name: str, size: int) -> Group:
        procs = []
        for _ in range(size):
            procs.append(BrokerProc(self.next_index, name, self.net, self.workdir, self.mode,
                                    retention_s=self.retention_s, proxied=self.proxied, route_file=self.route_file,
                                    lazy=self.lazy))
            self.next_index += 1
        g = Group(name, procs, self.workdir / f"{name}.status.json", self.workdir / f"{name}.pods.json",
                  controller_log=self.workdir / f"{name}.controller.log")
        write_state(g.status_path, {"master": procs[0].name, "epoch": 1, "brokers": []})
        self.groups[name] = g
        return g

    def start_group(self, g: Group, timeout: float = 40) -> None:
        """Its brokers up and its controller, until the slaves are in sync (the controller approves
        them: sync_set.py); the route lists it once it serves."""
        for p in g.procs:
            p.mount()
        g.procs[0].start(None)
        for p in g.procs[1:]:
            p.start(g.procs[0].address)
        self.report_pods(g)
        deadline = time.monotonic() + timeout
        # The controller only once the master answers: it fails over a master silent for 3 s, and a
        # loaded host can take longer than that to bring one up (fixed seed 3 and seed 745 did: b1
        # promoted at epoch 2 before b0 ever answered, and the group never came up as started).
        began = time.monotonic()
        while brokers.PLAIN.try_info(g.procs[0].ip) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        answered = time.monotonic() - began   # (the timeout whole: it never answered before the controller)
        self.start_controller(g)
        while time.monotonic() < deadline:
            info = brokers.PLAIN.try_info(g.procs[0].ip)
            if info and sum(1 for s in info.slaves if s.get("in_sync")) == len(g.procs) - 1:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"group {g.name} did not come up in {timeout:.0f}s (its master first answered after "
                               f"{answered:.1f}s): {self.why_not_up(g)}\n"
                               + "; ".join(p.log_path.read_text()[-500:] for p in g.procs))

    def why_not_up(self, g: Group) -> str:
        """What start_group waited for and did not see: the master's answer, its view of each slave,
        and the controller's (a group that never came up left no other trace: seeds 745, 756, fixed 3)."""
        try:
            info, why = brokers.PLAIN.info(g.procs[0].ip), ""
        except (brokers.Unreachable, brokers.BrokerError, brokers.Incompatible) as e:
            info, why = None, str(e)
        if info is None:
            master = f"master {g.procs[0].name} does not answer GET /api/v1/broker ({why})"
        else:
            slaves = ", ".join(f"{s.get('name')} {'in sync' if s.get('in_sync') else 'not in sync'} "
                               f"(acknowledged {s.get('acknowledged_offset')}, lag {s.get('lag')})"
                               for s in info.slaves) or "none subscribed"
            master = (f"master {g.procs[0].name} answers as {info.role} at epoch {info.epoch}; its slaves: {slaves}; "
                      f"sync set it counts: {info.sync_set}" + (f"; unconfirmed: {info.unconfirmed}" if info.unconfirmed else ""))
        ctl = g.controller
        running = ("not started" if ctl is None else "running" if ctl.poll() is None else f"exited {ctl.returncode}")
        st = g.status
        said = g.controller_log.read_text()[-400:].strip() if g.controller_log and g.controller_log.exists() else ""
        return (f"{master}; controller {running}, status syncSet {st.get('syncSet')}, blocked {st.get('blocked')}, "
                f"masterUnavailableSince {st.get('masterUnavailableSince')}; the controller said: {said or 'nothing'}")

    def start_controller(self, g: Group, crash_at: str = "") -> None:
        with open(g.controller_log, "ab") as out:
            g.controller = subprocess.Popen(
                [sys.executable, "-m", "chaos.controller", "--state", str(g.status_path), "--pods", str(g.pods_path),
                 "--mode", replication_of(self.mode), "--flush", flush_of(self.mode),
                 *(["--crash-at", crash_at] if crash_at else [])],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        g.controller_starts += 1

    def kill_controller(self, g: Group) -> None:
        if g.controller is not None and g.controller.poll() is None:
            g.controller.send_signal(signal.SIGKILL)
            g.controller.wait(10)

    # ---- the kubelet -----------------------------------------------------------------------------

    def report_pods(self, g: Group) -> None:
        write_state(g.pods_path, {p.name: {"ip": p.ip, "index": p.index, "ready": p.running and not p.paused}
                                  for p in g.procs})

    def kubelet_pass(self) -> None:
        """Dead brokers started again as the status says (the master as master, the others as its
        slaves), after their back-off; every group's readiness reported."""
        for g in self.live_groups:
            master = g.master
            for p in g.procs:
                code = p.reap()
                if code is not None:
                    log.info("%s exited with %s", p.name, code)
                if p.proc is not None and not p.running and time.monotonic() >= p.down_until:
                    p.start(None if p is master else master.address)
            self.report_pods(g)

    # ---- membership --------------------------------------------------------------------------------

    def add_group(self, name: str, size: int) -> Group:
        g = self.make_group(name, size)
        self.write_route()  # first: a broker refuses to start on a route that does not list its group
        self.start_group(g)
        g.events.append({"at": time.monotonic(), "what": "added", "version": self.route_version})
        return g

    def drain(self, g: Group) -> None:
        g.state = "draining"
        self.write_route()
        g.drain_version = self.route_version
        g.events.append({"at": time.monotonic(), "what": "draining", "version": self.route_version})

    def removal(self, g: Group) -> scaling.Remove | scaling.Wait:
        """The operator's rule on whether the draining group may go now."""
        report, why = None, ""
        head = g.master
        try:
            running = brokers.PLAIN.route_version(head.ip)
            d = brokers.PLAIN.drain(head.ip)
            report = scaling.DrainReport(undelivered=d.undelivered, pending_transactions=d.pending_transactions,
                                         drained=d.drained, route_version=running, topics=d.topics,
                                         undecided_jobs=d.undecided_jobs, unreleased_jobs=d.unreleased_jobs,
                                         unreleased_decisions=d.unreleased_decisions)
        except (brokers.Unreachable, brokers.BrokerError, brokers.Incompatible) as e:
            why = str(e)
        waiting: dict[str, int] | None = {}
        waiting_why = ""
        for other in self.live_groups:
            if other is g:
                continue
            try:
                running = brokers.PLAIN.route_version(other.master.ip)
                if running < g.drain_version:  # (the operator's rule: reconcile.waiting_on)
                    waiting, waiting_why = None, f"{other.name}'s master runs route version {running}"
                    break
                for home, n in brokers.PLAIN.drain(other.master.ip).waiting_on.items():
                    if home == g.name:
                        waiting[other.name] = n
            except (brokers.Unreachable, brokers.BrokerError, brokers.Incompatible) as e:
                waiting, waiting_why = None, str(e)
                break
        return scaling.decide_removal(g.name, report, why, g.drain_version, False, waiting, waiting_why)

    def remove(self, g: Group) -> None:
        g.state = "removed"
        self.write_route()
        self.kill_controller(g)
        for p in g.procs:
            p.removed = True
            p.stop()
        g.events.append({"at": time.monotonic(), "what": "removed", "version": self.route_version})

    def stop(self) -> None:
        for g in self.groups.values():
            self.kill_controller(g)
            for p in g.procs:
                try:
                    p.stop()
                finally:  # (a broker that would not die still has its filesystem unmounted)
                    try:
                        p.unmount()
                    except Exception:  # noqa: BLE001 - the next brokers' teardown goes on
                        log.exception("unmounting %s failed", p.name)


def start_cluster(net: Network, workdir: Path, mode: str = "SYNC", groups: int = 2, size: int = 3, *,
                  retention_s: float = 0, proxied: bool = False, lazy: bool = False) -> Cluster:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    cluster = Cluster(net, workdir, mode, retention_s=retention_s, proxied=proxied, lazy=lazy)
    made = [cluster.make_group(f"g{i}", size) for i in range(groups)]
    cluster.write_route()
    for g in made:
        cluster.start_group(g)
    return cluster
