"""The nemesis on the node: faults done to the TxBroker's pods and the operator's as the node's own
tools would do them, each picked from the seed, held a few seconds and healed.

  process   kill-master, kill-slave    SIGKILL of the broker container's process (containerd's task,
                                       `ctr tasks kill`, as the kernel's OOM killer would): the kubelet
                                       restarts the container, with its crash back-off
            pause-master, pause-slave  SIGSTOP of it, SIGCONT at the heal
  pod       delete-master, delete-slave  `kubectl delete pod --grace-period=0 --force`: the pod is gone
                                       at once; the operator makes a new one on the same claim
  network   partition-master           the master cut from its group's other brokers (iptables in the
                                       pod's network namespace, entered from the node: both ways)
            partition-slave            a slave cut from its master (in, out or both)
            isolate-master             the master cut from everything (clients, peers, the operator,
                                       the kubelet's probes); every heal flushes the rules
  operator  kill-operator-leader       SIGKILL of the operator holding the Lease (restarted by the
                                       kubelet, it stands by; the other replica takes the Lease once it
                                       expires)
            delete-operator-leader     its pod force-deleted (the Deployment makes another)
            kill-operator-mid-failover a group's master killed, and the operator leader killed once it
                                       has noticed (masterUnavailableSince set): the standby must
                                       finish the failover the dead leader started

A group's master is the one the TxBroker's status names at the time (the operator's view, as the
local nemesis takes the controller's).
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from typing import Any

from chaos.k8s.deploy import Deployment, ready

FAMILIES = {
    "process": ("kill-master", "kill-slave", "pause-master", "pause-slave"),
    "pod": ("delete-master", "delete-slave"),
    "network": ("partition-master", "partition-slave", "isolate-master"),
    "operator": ("kill-operator-leader", "delete-operator-leader", "kill-operator-mid-failover"),
}
HELD = {"pause-master", "pause-slave", "partition-master", "partition-slave", "isolate-master"}
CHAIN_IN, CHAIN_OUT = "TXB-CHAOS-IN", "TXB-CHAOS-OUT"


def family_of(kind: str) -> str:
    return next(f for f, kinds in FAMILIES.items() if kind in kinds)


class Node:
    """The node's handles on a pod: its containers' tasks (containerd) and its network namespace."""

    def __init__(self, d: Deployment):
        self.d, self.tb = d, d.tb

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.tb.run("ctr", "-a", self.tb.sock, "-n", "k8s.io", *args, check=check, timeout=30)

    def container_ids(self, pod: dict) -> dict[str, str]:
        """container name -> containerd id of each running container."""
        return {s["name"]: s["containerID"].split("://", 1)[1]
                for s in (pod.get("status") or {}).get("containerStatuses") or []
                if "running" in (s.get("state") or {}) and s.get("containerID")}

    def signal(self, pod_name: str, sig: str) -> str:
        """Signal the main process of the pod's running container; its containerd id."""
        pod = self.d.api.pod(self.d.namespace, pod_name)
        ids = self.container_ids(pod or {})
        if not ids:
            raise LookupError(f"no running container in {pod_name}")
        cid = next(iter(ids.values()))
        r = self.ctr("tasks", "kill", "--signal", sig, cid, check=False)
        if r.returncode:
            raise LookupError(f"{sig} to {pod_name} ({cid[:12]}): {r.stderr.strip()}")
        return cid

    def signal_container(self, cid: str, sig: str) -> None:
        self.ctr("tasks", "kill", "--signal", sig, cid, check=False)

    def force_delete(self, pod_name: str) -> None:
        self.tb.kubectl("delete", "pod", pod_name, "-n", self.d.namespace, "--grace-period=0", "--force",
                        "--wait=false", check=False)

    def netns(self, pod_name: str) -> str:
        """The pod's network namespace as the node sees it (its sandbox's: it outlives a restarted
        container), from the OCI spec of one of its containers."""
        pod = self.d.api.pod(self.d.namespace, pod_name) or {}
        for s in (pod.get("status") or {}).get("containerStatuses") or []:
            cid = (s.get("containerID") or "").split("://", 1)[-1]
            if not cid:
                continue
            r = self.ctr("containers", "info", cid, check=False)
            if r.returncode == 0:
                for ns in json.loads(r.stdout)["Spec"]["linux"]["namespaces"]:
                    if ns["type"] == "network" and ns.get("path"):
                        return ns["path"]
        raise LookupError(f"no network namespace found for {pod_name}")

    def iptables(self, netns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.tb.run("nsenter", f"--net={netns}", "iptables", "-w", *args, check=check, timeout=30)

    def cut(self, pod_name: str, peers: list[str] | None, direction: str = "both") -> str:
        """Drop what the pod receives from (`in`) and/or sends to (`out`) each of `peers` (IPs), or
        everyone but itself (None); returns the namespace, for the heal."""
        netns = self.netns(pod_name)
        for chain, builtin in ((CHAIN_IN, "INPUT"), (CHAIN_OUT, "OUTPUT")):
            self.iptables(netns, "-N", chain, check=False)
            if self.iptables(netns, "-C", builtin, "-j", chain, check=False).returncode:
                self.iptables(netns, "-I", builtin, "-j", chain)
        if peers is None:
            self.iptables(netns, "-A", CHAIN_IN, "-i", "lo", "-j", "RETURN")
            self.iptables(netns, "-A", CHAIN_IN, "-j", "DROP")
            self.iptables(netns, "-A", CHAIN_OUT, "-o", "lo", "-j", "RETURN")
            self.iptables(netns, "-A", CHAIN_OUT, "-j", "DROP")
            return netns
        for ip in peers:
            if direction in ("in", "both"):
                self.iptables(netns, "-A", CHAIN_IN, "-s", ip, "-j", "DROP")
            if direction in ("out", "both"):
                self.iptables(netns, "-A", CHAIN_OUT, "-d", ip, "-j", "DROP")
        return netns

    def uncut(self, netns: str) -> None:
        for chain in (CHAIN_IN, CHAIN_OUT):
            self.iptables(netns, "-F", chain, check=False)  # gone with its pod, if it was deleted since


class Nemesis:
    def __init__(self, rnd: random.Random, d: Deployment, log=print):
        self.rnd, self.d, self.node, self.log = rnd, d, Node(d), log
        self.events: list[dict] = []
        self.cuts: list[str] = []  # network namespaces with rules in force
        self.paused: list[str] = []  # containerd ids stopped

    # ---- targets ---------------------------------------------------------------------------------

    def _pick(self, kind: str) -> tuple[str, str]:
        groups = self.d.groups()
        group = self.rnd.choice(sorted(groups))
        master = groups[group].get("master") or self.d.members(group)[0]
        slaves = [p for p in self.d.members(group) if p != master]
        slave = self.rnd.choice(slaves)
        return group, (master if "master" in kind or kind.startswith(("kill-operator", "delete-operator"))
                       else slave)

    def _ip(self, pod_name: str) -> str | None:
        pod = self.d.api.pod(self.d.namespace, pod_name)
        return (pod or {}).get("status", {}).get("podIP")

    # ---- faults ----------------------------------------------------------------------------------

    def inject(self, kind: str) -> dict:
        try:
            group, target = self._pick(kind)
        except Exception as e:  # noqa: BLE001 - the API server did not answer: no fault this time
            ev = {"kind": kind, "family": family_of(kind), "group": "", "target": "", "start": time.monotonic(),
                  "at": time.time(), "skipped": f"no target: {type(e).__name__}: {e}"[:300]}
            self.events.append(ev)
            return ev
        ev: dict[str, Any] = {"kind": kind, "family": family_of(kind), "group": group, "target": target,
                              "start": time.monotonic(), "at": time.time()}
        node = self.node
        try:
            if kind in ("kill-master", "kill-slave"):
                ev["container"] = node.signal(target, "SIGKILL")[:12]
            elif kind in ("pause-master", "pause-slave"):
                cid = node.signal(target, "SIGSTOP")
                self.paused.append(cid)
                ev["container"] = cid
            elif kind in ("delete-master", "delete-slave"):
                node.force_delete(target)
            elif kind == "partition-master":
                peers = [ip for p in self.d.members(group) if p != target and (ip := self._ip(p))]
                ev["netns"] = node.cut(target, peers, "both")
                ev["peers"] = peers
            elif kind == "partition-slave":
                ev["direction"] = self.rnd.choice(["in", "out", "both"])
                master = self.d.groups()[group].get("master")
                ip = self._ip(master) if master else None
                ev["netns"] = node.cut(target, [ip] if ip else [], ev["direction"])
                ev["peers"] = [ip]
            elif kind == "isolate-master":
                ev["netns"] = node.cut(target, None)
            elif kind in ("kill-operator-leader", "delete-operator-leader"):
                ev["target"] = leader = self.d.leader()
                if not leader:
                    raise LookupError("no operator holds the Lease")
                if kind == "kill-operator-leader":
                    ev["container"] = node.signal(leader, "SIGKILL")[:12]
                else:
                    node.force_delete(leader)
            elif kind == "kill-operator-mid-failover":  # held until the standby finishes it (hold())
                ev["master"] = target
                node.signal(target, "SIGKILL")
                noticed = self._wait(lambda: self.d.groups()[group].get("masterUnavailableSince"), 20)
                ev["noticed_after_s"] = round(time.monotonic() - ev["start"], 2) if noticed else None
                ev["target"] = leader = self.d.leader()
                if not leader:
                    raise LookupError("no operator holds the Lease")
                ev["leader_killed"] = node.signal(leader, "SIGKILL")[:12]
        except Exception as e:  # noqa: BLE001 - e.g. the target is restarting: the fault did not happen
            ev["skipped"] = f"{type(e).__name__}: {e}"[:300]
        if "netns" in ev:
            self.cuts.append(ev["netns"])
        self.events.append(ev)
        return ev

    def _wait(self, probe, timeout: float, interval: float = 0.2):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = probe()
            except Exception:  # noqa: BLE001 - the API server busy: look again
                got = None
            if got:
                return got
            time.sleep(interval)
        return None

    def hold(self, ev: dict, seconds: float) -> None:
        """Keep the fault `seconds` (drawn with the schedule), or until the failover it started ends."""
        if ev["kind"] == "kill-operator-mid-failover" and "skipped" not in ev:
            # the standby takes the Lease once it expires (15 s) and finishes the failover; the
            # master crash-loops meanwhile (killed again whenever the kubelet restarts it), else a
            # restart within the Lease's expiry would leave nothing to finish
            group, master = ev["group"], ev["master"]

            def failed_over():
                if self.d.groups()[group].get("master") != master:
                    return True
                try:
                    self.node.signal(master, "SIGKILL")
                    ev["master_kills"] = ev.get("master_kills", 1) + 1
                except LookupError:
                    pass  # not running (the kubelet's back-off)
                return False
            done = self._wait(failed_over, 90, 0.3)
            ev["failover_finished_after_s"] = round(time.monotonic() - ev["start"], 2) if done else None
        else:
            time.sleep(seconds)

    def heal(self, ev: dict) -> None:
        kind = ev["kind"]
        if kind in ("pause-master", "pause-slave") and "container" in ev:
            self.node.signal_container(ev["container"], "SIGCONT")
            self.paused.remove(ev["container"])
            ev["container"] = ev["container"][:12]
        elif "netns" in ev:
            self.node.uncut(ev["netns"])
            self.cuts.remove(ev["netns"])
        ev["healed"] = time.monotonic()

    def heal_all(self) -> None:
        for cid in list(self.paused):
            self.node.signal_container(cid, "SIGCONT")
        self.paused.clear()
        for netns in list(self.cuts):
            self.node.uncut(netns)
        self.cuts.clear()


def all_ready(d: Deployment) -> bool:
    return all(ready(p) for p in d.broker_pods()) and len(d.broker_pods()) == len(d.groups()) * 3
