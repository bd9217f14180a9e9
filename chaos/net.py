"""The run's own network: a hub namespace with a bridge, one namespace per broker on it, and
packet filtering inside a broker's namespace to cut it off from chosen peers.

    hub netns  txbc<tag>        bridge txbc0 10.251.0.1/24: the harness, its clients and controller
    broker i   txbc<tag>-b<i>   eth0 10.251.0.(10+i)/24, the standard ports 10911 (data), 10912 (admin)

Nothing outside these namespaces is touched. A partition is iptables rules in the broker's own
namespace (INPUT and/or OUTPUT, by peer address), so it drops packets without a reset, as a real cut
cable does; a lossy link is the same rule under iptables' `statistic` match (a random share of the
packets dropped: this kernel has no netem; delay is chaos/proxy.py's); healing flushes them.
"""

from __future__ import annotations

import os
import subprocess

SUBNET = "10.251.0"
HUB_IP = f"{SUBNET}.1"


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def in_ns(ns: str, *cmd: str) -> list[str]:
    """`cmd` run in namespace `ns` (nsenter execs it in place: the pid is the command's)."""
    return ["nsenter", f"--net=/var/run/netns/{ns}", *cmd]


class Network:
    def __init__(self, tag: str, brokers: int):
        self.hub = f"txbc{tag}"
        self.brokers = [f"{self.hub}-b{i}" for i in range(brokers)]
        self.ips = [f"{SUBNET}.{10 + i}" for i in range(brokers)]
        self.cuts: dict[int, list[tuple[str, str]]] = {}  # broker -> (chain, peer) rules in force

    def up(self) -> "Network":
        if os.geteuid() != 0:
            raise SystemExit("the fault harness needs root: it makes network namespaces and packet filters")
        self.down()
        _run("ip", "netns", "add", self.hub)
        hub = lambda *a: _run(*in_ns(self.hub, *a))  # noqa: E731
        hub("ip", "link", "set", "lo", "up")
        hub("ip", "link", "add", "txbc0", "type", "bridge")
        hub("ip", "addr", "add", f"{HUB_IP}/24", "dev", "txbc0")
        hub("ip", "link", "set", "txbc0", "up")
        for i, (ns, ip) in enumerate(zip(self.brokers, self.ips)):
            _run("ip", "netns", "add", ns)
            hub("ip", "link", "add", f"vb{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            hub("ip", "link", "set", f"vb{i}", "master", "txbc0", "up")
            b = lambda *a, ns=ns: _run(*in_ns(ns, *a))  # noqa: E731
            b("ip", "link", "set", "lo", "up")
            b("ip", "addr", "add", f"{ip}/24", "dev", "eth0")
            b("ip", "link", "set", "eth0", "up")
        return self

    def down(self) -> None:
        """Every process still in the run's namespaces killed (a schedule that died leaves brokers),
        then the namespaces deleted."""
        for ns in [*self.brokers, self.hub]:
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "delete", ns, check=False)

    # ---- partitions ----------------------------------------------------------------------------

    def cut(self, broker: int, peer_ip: str, direction: str) -> None:
        """Drop what `broker` receives from (`in`), sends to (`out`), or both with `peer_ip`."""
        chains = {"in": [("INPUT", "-s")], "out": [("OUTPUT", "-d")],
                  "both": [("INPUT", "-s"), ("OUTPUT", "-d")]}[direction]
        for chain, flag in chains:
            _run(*in_ns(self.brokers[broker], "iptables", "-w", "-A", chain, flag, peer_ip, "-j", "DROP"))
            self.cuts.setdefault(broker, []).append((chain, peer_ip))

    def lose(self, broker: int, peer_ips: list[str], probability: float) -> None:
        """Drop a random `probability` share of the packets between `broker` and each of `peer_ips`,
        both ways (TCP retransmits: a slow, jittery link, not a cut one)."""
        for peer_ip in peer_ips:
            for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d")):
                _run(*in_ns(self.brokers[broker], "iptables", "-w", "-A", chain, flag, peer_ip, "-m", "statistic",
                            "--mode", "random", "--probability", f"{probability:.3f}", "-j", "DROP"))
                self.cuts.setdefault(broker, []).append((chain, peer_ip))

    def heal(self, broker: int | None = None) -> None:
        for b in ([broker] if broker is not None else list(self.cuts)):
            if self.cuts.pop(b, None):
                for chain in ("INPUT", "OUTPUT"):
                    _run(*in_ns(self.brokers[b], "iptables", "-w", "-F", chain), check=False)
