"""chaos/schedule.py's last look, after settling: every live group's master lists all of its
slaves in sync (a damaged, cut or powered-off replica re-synced from its master), or the group is
named with what its master sees. Stand-in masters, no broker: the schedules are its real use."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos import schedule  # noqa: E402


def group(name: str, ip: str, size: int = 3):
    procs = [SimpleNamespace(name=f"{name}-b{i}", ip=ip if i == 0 else f"{ip}.{i}") for i in range(size)]
    return SimpleNamespace(name=name, procs=procs, master=procs[0])


def masters(answers: dict[str, object]):
    """An AdminClient whose broker_info answers by the master's address (an exception is raised)."""
    class Admin:
        def __init__(self, url: str, timeout: float):
            self.ip = url.split("//")[1].split(":")[0]

        def broker_info(self):
            a = answers[self.ip]
            if isinstance(a, Exception):
                raise a
            return a
    return Admin


def info(role: str, *slaves: tuple[str, bool]):
    links = [SimpleNamespace(name=n, in_sync=s) for n, s in slaves]
    return SimpleNamespace(role=role, replication=SimpleNamespace(slaves=links))


def test_groups_whose_slaves_are_all_in_sync_pass(monkeypatch):
    monkeypatch.setattr(schedule, "AdminClient", masters({
        "g0": info("master", ("b1", True), ("b2", True)),
        "g2": info("master", ("b7", True))}))   # an added group of two
    cluster = SimpleNamespace(live_groups=[group("g0", "g0"), group("g2", "g2", size=2)])
    assert schedule._replicas_back(cluster, timeout=0) == {}


def test_a_slave_never_back_in_sync_names_its_group_and_what_the_master_sees(monkeypatch):
    monkeypatch.setattr(schedule, "AdminClient", masters({
        "g0": info("master", ("b1", True), ("b2", True)),
        "g1": info("master", ("b4", True), ("b5", False)),      # b5: damaged, never seeded
        "g2": info("slave"),                                     # the controller's master answers as a slave
        "g3": ConnectionRefusedError("connection refused")}))
    cluster = SimpleNamespace(live_groups=[group(g, g) for g in ("g0", "g1", "g2", "g3")])
    behind = schedule._replicas_back(cluster, timeout=0)
    assert behind == {
        "g1": "its master g1-b0 lists 1 of 2 slaves in sync (b4)",
        "g2": "g2-b0, its master by the controller, answers as slave",
        "g3": "its master g3-b0 did not answer: connection refused"}
