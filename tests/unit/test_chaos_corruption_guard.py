"""chaos/nemesis.py's rule that corruption strikes a minority: a group with a broker damaged and not
yet whole again (back in sync with its master, or serving as master) gets no second damage, so a
group of two is never left with two damaged copies. A stand-in cluster and broker status, no broker."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos import nemesis as nemesis_module  # noqa: E402
from chaos.nemesis import Nemesis  # noqa: E402


def group(name: str):
    m = SimpleNamespace(name=f"{name}-0", ip=f"ip-{name}-0", running=True)
    s = SimpleNamespace(name=f"{name}-1", ip=f"ip-{name}-1", running=True)
    return SimpleNamespace(name=name, state="active", master=m, procs=[m, s])


@pytest.fixture
def status(monkeypatch):
    """What each master's admin API says about its slaves: master ip -> {slave name: in_sync}."""
    slaves: dict[str, dict[str, bool]] = {}

    def try_info(ip):
        if ip not in slaves:
            return None  # unreachable
        return SimpleNamespace(slaves=tuple({"name": n, "in_sync": s} for n, s in slaves[ip].items()))

    monkeypatch.setattr(nemesis_module.brokers, "PLAIN", SimpleNamespace(try_info=try_info))
    return slaves


def nemesis(*groups):
    return Nemesis(random.Random(1), SimpleNamespace(live_groups=list(groups), procs=[]))


def test_a_group_with_a_damaged_slave_gets_no_second_damage_until_the_slave_is_back_in_sync(status):
    g0 = group("g0")
    n = nemesis(g0)
    n.damaged["g0-1"] = "g0"
    status["ip-g0-0"] = {"g0-1": False}  # re-seeding, not yet in sync
    assert not n.possible("corrupt-slave") and not n.possible("corrupt-master")
    status["ip-g0-0"] = {"g0-1": True}
    assert n.possible("corrupt-master")
    assert n.damaged == {}  # whole again: forgotten


def test_an_unreachable_master_does_not_count_a_damaged_slave_whole(status):
    n = nemesis(group("g0"))
    n.damaged["g0-1"] = "g0"
    assert not n.possible("corrupt-running-slave")  # no status: damaged as far as anyone knows


def test_a_damaged_master_is_whole_again_once_it_serves_as_master(status):
    g0 = group("g0")
    n = nemesis(g0)
    n.damaged["g0-0"] = "g0"
    g0.master.running = False  # deposed and re-seeding
    status["ip-g0-0"] = {"g0-1": True}
    assert not n.possible("corrupt-slave")
    g0.master.running = True
    assert n.possible("corrupt-slave")


def test_corruption_picks_only_a_whole_group(status):
    g0, g1 = group("g0"), group("g1")
    n = nemesis(g0, g1)
    n.damaged["g0-1"] = "g0"
    status["ip-g0-0"] = {"g0-1": False}
    status["ip-g1-0"] = {"g1-1": True}
    assert n.possible("corrupt-slave")
    assert {n._group(whole_only=True).name for _ in range(20)} == {"g1"}
    assert {n._group().name for _ in range(40)} == {"g0", "g1"}  # other faults still strike either
