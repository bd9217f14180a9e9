"""A cluster of broker groups on this machine: per group a master and its slaves (real `txbroker
broker` processes), all given one cluster file listing every group's addresses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from support.brokers import BrokerProcess
from support.waiting import wait_until
from txbroker.client.admin import AdminClient

# How long a group gets to come up, load a route or bring a slave back in sync: the default 15 s
# was too little for two groups starting beside Spark's tests on a loaded two-core host.
SETTLE = 60.0

FLAGS = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-heartbeat-ms", "100",
         "--replication-timeout-ms", "1000", "--check-interval-ms", "300", "--transaction-timeout-ms", "200",
         "--message-delay-level", "200ms 200ms 200ms 1s")  # retries come back quickly


@dataclass
class Group:
    name: str
    brokers: list[BrokerProcess]
    master_index: int = 0

    @property
    def master(self) -> BrokerProcess:
        return self.brokers[self.master_index]

    @property
    def addresses(self) -> list[str]:
        return [b.address for b in self.brokers]


@dataclass
class Cluster:
    path: Path
    groups: list[Group]
    version: int = 1
    states: dict[str, str] = field(default_factory=dict)

    def group(self, name: str) -> Group:
        return next(g for g in self.groups if g.name == name)

    @property
    def bootstrap(self) -> list[str]:
        return [self.groups[-1].brokers[-1].address]  # any broker will do: the last group's last slave

    def write(self) -> None:
        doc = {"cluster": "local", "version": self.version,
               "groups": [{"name": g.name, "addresses": g.addresses, "state": self.states.get(g.name, "active")}
                          for g in self.groups]}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc))
        tmp.replace(self.path)  # one change the brokers see whole

    def publish(self, **states: str) -> None:
        """A new route version (groups' states changed), seen by every broker."""
        self.states.update(states)
        self.version += 1
        self.write()
        for g in self.groups:
            for b in g.brokers:
                if b.proc is not None and b.proc.poll() is None:
                    wait_until(lambda b=b: AdminClient(b.admin_url).get("/api/v1/cluster")["route"]["version"]
                               == self.version, SETTLE, what=f"{b.address} to load route version {self.version}")

    def promote(self, g: Group, index: int, epoch: int) -> None:
        """Make broker `index` of `g` its master (as the operator does), the others its slaves."""
        new = g.brokers[index]
        AdminClient(new.admin_url).post("/api/v1/role", {"role": "master", "epoch": epoch})
        for i, b in enumerate(g.brokers):
            if i != index and b.proc is not None and b.proc.poll() is None:
                AdminClient(b.admin_url).post("/api/v1/role", {"role": "slave", "master": new.address, "epoch": epoch})
        g.master_index = index

    def rejoin(self, g: Group, index: int) -> None:
        """Start a killed broker of `g` again as a slave of its master (the kubelet's restart, the
        operator's demotion), and wait until it is in sync."""
        b = g.brokers[index]
        args = [a for a in b.extra_args]
        if "--role" in args:
            at = args.index("--role")
            del args[at:at + 4]  # --role slave --master ADDRESS
        b.extra_args = [*args, "--role", "slave", "--master", g.master.address]
        b.start()
        wait_until(lambda: any(x["in_sync"] for x in AdminClient(g.master.admin_url).get(
            "/api/v1/broker")["replication"]["slaves"]), SETTLE, what=f"{b.address} back in sync in group {g.name}")

    def add_group(self, tmp_path: Path, slaves: int = 1, flags=FLAGS) -> Group:
        """A new group (scale up): listed in a new route version, then started."""
        name = f"g{max(int(g.name[1:]) for g in self.groups) + 1}"
        g = Group(name, [BrokerProcess(tmp_path / f"{name}-{k}-data", tmp_path / f"{name}-{k}.log", [], None)
                         for k in range(1 + slaves)])
        self.groups.append(g)
        self.publish()
        g.master.extra_args = ["--group", name, "--cluster-file", str(self.path), "--broker-name", f"{name}-0", *flags]
        g.master.start()
        for k, b in enumerate(g.brokers[1:], 1):
            b.extra_args = ["--group", name, "--cluster-file", str(self.path), "--broker-name", f"{name}-{k}",
                            "--role", "slave", "--master", g.master.address, *flags]
            b.start()
        wait_until(lambda: sum(x["in_sync"] for x in AdminClient(g.master.admin_url).get(
            "/api/v1/broker")["replication"]["slaves"]) == slaves, SETTLE, what=f"group {name}'s slaves in sync")
        return g

    def remove_group(self, name: str) -> None:
        """Drop a drained group from the route once no other group's participants wait on it, then
        stop its brokers."""
        for other in self.groups:
            if other.name != name:
                wait_until(lambda o=other: not AdminClient(o.master.admin_url).get("/api/v1/drain")["waiting_on"]
                           .get(name), SETTLE, what=f"{other.name}'s participants done with {name}")
        g = self.group(name)
        self.groups.remove(g)
        self.states.pop(name, None)
        self.publish()
        for b in g.brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.terminate()
                b.proc.wait(20)

    def stop(self) -> None:
        for g in self.groups:
            for b in g.brokers:
                if b.proc is not None and b.proc.poll() is None:
                    b.proc.kill()
                    b.proc.wait(10)


def start_cluster(tmp_path: Path, groups: int = 2, slaves: int = 1, flags=FLAGS) -> Cluster:
    path = tmp_path / "cluster.yaml"
    made: list[Group] = []
    for i in range(groups):
        name = f"g{i}"
        brokers = [BrokerProcess(tmp_path / f"{name}-{k}-data", tmp_path / f"{name}-{k}.log", [], None)
                   for k in range(1 + slaves)]
        made.append(Group(name, brokers))
    cluster = Cluster(path, made)
    cluster.write()
    written = {b.address for g in made for b in g.brokers}
    try:
        for g in made:  # masters first: a slave is told its master's address as it finally bound
            g.master.extra_args = ["--group", g.name, "--cluster-file", str(path), "--broker-name", f"{g.name}-0",
                                   *flags]
            g.master.start()
        for g in made:
            for k, s in enumerate(g.brokers[1:], 1):
                s.extra_args = ["--group", g.name, "--cluster-file", str(path), "--broker-name", f"{g.name}-{k}",
                                "--role", "slave", "--master", g.master.address, *flags]
                s.start()
        if {b.address for g in made for b in g.brokers} != written:  # a port was taken before a broker bound it
            cluster.publish()
        for g in made:
            wait_until(lambda g=g: sum(x["in_sync"] for x in AdminClient(g.master.admin_url).get(
                "/api/v1/broker")["replication"]["slaves"]) == slaves, SETTLE, what=f"group {g.name}'s slaves in sync")
    except BaseException:
        cluster.stop()
        raise
    return cluster
