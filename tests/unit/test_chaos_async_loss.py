"""chaos/schedule.py's accounting of an ASYNC loss: what follows from a group losing acknowledged
writes (torn spanning transactions, a parked participant, a poison message whose retry was lost)
is counted with the loss, and only on the group that lost something; the same anomalies without a
loss stay anomalies. Hand-written anomalies and a stand-in cluster, no broker."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos.schedule import _consequences_of_async_loss  # noqa: E402
from chaos.workload import History, Tx  # noqa: E402


def cluster(failovers: dict[str, list[str]]):
    return SimpleNamespace(groups={name: SimpleNamespace(name=name, status={"failovers": [{"message": m} for m in ms]})
                                   for name, ms in failovers.items()})


def history() -> History:
    h = History()
    h.add("t0-8607", Tx(["t0-8607.0.poison", "t0-8607.1"], "COMMIT", groups=["g2"]))
    h.add("t0-9000", Tx(["t0-9000.0.poison"], "COMMIT", groups=["g0"]))
    h.add("t0-31", Tx(["t0-31.0", "t0-31.1"], "COMMIT", groups=["g1", "g3"]))  # home g1, participant g3
    h.add("plain-7", Tx(["plain-7"], "COMMIT", kind="plain", groups=["g0"]))
    h.add("plain-8", Tx(["plain-8"], "COMMIT", kind="plain", groups=["g2"]))
    h.add("plain-9", Tx(["plain-9"], "COMMIT", kind="plain"))  # unanswered: its group unknown
    return h


def anomalies() -> dict[str, list[str]]:
    return {"torn": ["t0-1788 on g1+g0: 1 of 2 messages read (t0-1788.1)", "t0-77 on g0: 1 of 2 messages read"],
            "unresolved": ["g0: 1 transactions or jobs still pending, parked or undecided after settling",
                           "g3: 1 transactions or jobs still pending, parked or undecided after settling"],
            "dead letter": ["t0-8607.0.poison: poison in Orders, not in %DLQ%chaos-cg",
                            "t0-9000.0.poison: poison in Orders, not in %DLQ%chaos-cg"],
            "group phantom": ["plain-8: consumed, not in Orders", "plain-7: consumed, not in Orders",
                              "plain-9: consumed, not in Orders"],
            "offset regressed": ["g2 chaos-cg queue 1: committed offset 3 read from b7 at 10:00:00.000, 0.2 s after 9",
                                 "g0 chaos-cg queue 1: committed offset 3 read from b0 at 10:00:00.000, 0.2 s after 9"],
            "duplicated": ["t0-5 on g1: read twice"]}


def test_what_follows_a_groups_loss_is_counted_with_it_and_only_there():
    a = anomalies()
    after = _consequences_of_async_loss(
        a, ["plain-1114 (plain on g1): acknowledged COMMIT, 1 of 1 messages never read"],
        cluster({"g0": [], "g1": [], "g2": ["master b6 down for 2s; promoted b7 (offset 17924) at epoch 2; it may "
                                            "lack up to 12 records the master had"], "g3": []}), history())
    assert after == {"torn": ["t0-1788 on g1+g0: 1 of 2 messages read (t0-1788.1)"],
                     # g3's participant of t0-31, whose home g1 lost it
                     "unresolved": ["g3: 1 transactions or jobs still pending, parked or undecided after settling"],
                     "dead letter": ["t0-8607.0.poison: poison in Orders, not in %DLQ%chaos-cg"],
                     "group phantom": ["plain-8: consumed, not in Orders"],
                     "offset regressed": [anomalies()["offset regressed"][0]]}
    # the same on g0, which lost nothing, on no known group, and a duplicate anywhere stay anomalies
    assert a == {"torn": ["t0-77 on g0: 1 of 2 messages read"],
                 "unresolved": ["g0: 1 transactions or jobs still pending, parked or undecided after settling"],
                 "dead letter": ["t0-9000.0.poison: poison in Orders, not in %DLQ%chaos-cg"],
                 "group phantom": ["plain-7: consumed, not in Orders", "plain-9: consumed, not in Orders"],
                 "offset regressed": [anomalies()["offset regressed"][1]],
                 "duplicated": ["t0-5 on g1: read twice"]}


def test_without_a_loss_nothing_is_excused():
    a = anomalies()
    assert _consequences_of_async_loss(a, [], cluster({"g0": ["master b0 down for 2s; promoted b2 at epoch 2"]}),
                                       history()) == {}
    assert a == anomalies()


def test_under_async_flush_only_a_whole_groups_power_cut_may_lose_a_commit():
    from chaos.schedule import _losses_allowed

    lost = ["plain-1 (plain on g1): acknowledged COMMIT, 1 of 1 messages never read",
            "t0-2 (tx on g0): acknowledged COMMIT, 2 of 2 messages never read"]
    events = [{"kind": "power-loss-group", "group": "g1"}, {"kind": "power-loss-broker", "group": "g0"}]
    a = {"lost": list(lost)}
    assert _losses_allowed("ASYNC_FLUSH", a, events) == lost[:1]
    assert a == {"lost": lost[1:]}  # g0 lost one broker's power only: its slaves held the commit
    a = {"lost": list(lost)}
    assert _losses_allowed("ASYNC", a, events) == lost and a == {}
    a = {"lost": list(lost)}
    assert _losses_allowed("SYNC", a, events) == [] and a == {"lost": lost}


def test_the_loss_window_is_each_lost_commits_age_at_the_fault_that_lost_it():
    from chaos.schedule import _loss_window

    h = History()
    for key, group, acked_at in (("t0-1", "g1", 100.0), ("t0-2", "g1", 100.3), ("plain-3", "g0", 50.0),
                                 ("t0-4", "g2", 70.0)):
        h.add(key, Tx([key], "COMMIT", groups=[group]))
        h.txs[key].acked_at = acked_at
    events = [{"kind": "power-loss-group", "group": "g1", "start": 90.0},  # before both: not theirs
              {"kind": "power-loss-group", "group": "g1", "start": 100.4},
              {"kind": "kill-master", "group": "g0", "start": 50.1}]  # not a fault that loses writes
    lost = ["t0-1 (tx on g1): acknowledged COMMIT, 1 of 1 messages never read",
            "t0-2 (tx on g1): acknowledged COMMIT, 1 of 1 messages never read",
            "plain-3 (plain on g0): acknowledged COMMIT, 1 of 1 messages never read",
            "t0-4 (tx on g2): acknowledged COMMIT, 1 of 1 messages never read"]
    # g0's failover at wall time 1000.2 is 50.2 on the monotonic clock here (to_monotonic: -950)
    groups = SimpleNamespace(groups={"g0": SimpleNamespace(name="g0", status={"failovers": [{"at": 1000.2}]}),
                                     "g1": SimpleNamespace(name="g1", status={}),
                                     "g2": SimpleNamespace(name="g2", status={})})
    window = _loss_window(lost, h, events, groups, -950.0)
    assert window == {"power-loss-group": {"lost": 2, "median_ms": 250.0, "max_ms": 400.0},
                      "failover": {"lost": 1, "median_ms": 200.0, "max_ms": 200.0},
                      "unplaced": 1}  # g2 lost t0-4 with no power cut or failover after it: said, not hidden


def test_a_commit_acknowledged_while_a_cut_was_under_way_is_charged_to_that_cut():
    """Seed 706: commits acknowledged in the milliseconds between a cut's start and the brokers'
    going down were charged to the next cut, 5 s later, stretching the window it reports."""
    from chaos.schedule import _loss_window

    h = History()
    h.add("t0-1", Tx(["t0-1"], "COMMIT", groups=["g1"]))
    h.txs["t0-1"].acked_at = 90.02
    h.add("t0-2", Tx(["t0-2"], "COMMIT", groups=["g1"]))
    h.txs["t0-2"].acked_at = 89.9
    events = [{"kind": "power-loss-group", "group": "g1", "start": 90.0, "healed": 93.0},
              {"kind": "power-loss-group", "group": "g1", "start": 95.0, "healed": 97.0}]
    # and a failover while the cut held (a restarted master stepping down): the cut took them, not it
    groups = SimpleNamespace(groups={"g1": SimpleNamespace(name="g1", status={"failovers": [{"at": 92.0}]})})
    window = _loss_window(["t0-1 (tx on g1): acknowledged COMMIT, 1 of 1 messages never read",
                           "t0-2 (tx on g1): acknowledged COMMIT, 1 of 1 messages never read"], h, events, groups, 0.0)
    assert window == {"power-loss-group": {"lost": 2, "median_ms": 50.0, "max_ms": 100.0}}


def test_a_job_decision_lost_with_its_homes_power_cut_is_counted_with_the_loss():
    """Seed 708 (ASYNC_FLUSH): job.g0.e1.3323 was acknowledged COMMIT 39 ms before its home g0's power
    was cut as a whole; the decision, never fsynced, went with the cut, and the job expired ABORTED.
    That is the loss ASYNC flush allows on g0, like its members' commits; on a home that lost nothing
    it stays an anomaly."""
    h = history()
    h.jobs.update({"job.g0.e1.3323": "g0", "job.g2.e1.7": "g2"})
    a = {"decision changed": [
        "job job.g0.e1.3323: the coordinator was acknowledged COMMIT; its home later answered ABORTED",
        "job job.g2.e1.7: the coordinator was acknowledged COMMIT; its home later answered ABORTED"]}
    after = _consequences_of_async_loss(
        a, ["job.g0.e1.3323-m0 (member on g0): acknowledged COMMIT, 1 of 1 messages never read"],
        cluster({"g0": [], "g2": []}), h)
    assert after == {"decision changed": [
        "job job.g0.e1.3323: the coordinator was acknowledged COMMIT; its home later answered ABORTED"]}
    assert a == {"decision changed": [
        "job job.g2.e1.7: the coordinator was acknowledged COMMIT; its home later answered ABORTED"]}


def test_an_order_broken_where_a_cut_rewrote_a_consumed_position_is_counted_with_the_loss():
    """Seed 708 again (ASYNC_FLUSH): g1's cut took ord-k0-185 (at offset 184 of Ordered:3, consumed,
    its offset committed past it); ord-k0-187, retried through the cut, took offset 184 and the
    orderly consumer went on from 185 (188 first), reaching 187 only later. A consequence of the
    cut on g1; the same on a group that lost nothing stays an anomaly."""
    h = history()
    for n, g in ((187, "g1"), (188, "g1"), (5, "g0"), (6, "g0")):
        h.add(f"ord-k0-{n}" if g == "g1" else f"ord-k9-{n}", Tx([f"ord-k0-{n}" if g == "g1" else f"ord-k9-{n}"],
                                                              "COMMIT", kind="ordered", groups=[g]))
    a = {"order broken": ["key k0: first delivered 188 before 187 ... (11 pairs)",
                          "key k9: first delivered 6 before 5"]}
    after = _consequences_of_async_loss(
        a, ["ord-k0-185 (ordered on g1): acknowledged COMMIT, 1 of 1 messages never read"],
        cluster({"g0": [], "g1": []}), h)
    assert after == {"order broken": ["key k0: first delivered 188 before 187 ... (11 pairs)"]}
    assert a == {"order broken": ["key k9: first delivered 6 before 5"]}


def test_a_drain_waiting_on_participants_parked_for_a_home_that_lost_them_waits_for_an_operator():
    """Seed 781 (ASYNC): g1's power cut lost three spanning transactions; their participants on g0
    were parked (an operator decides them), and g0, draining, holds them: it stays draining, as
    designed. Counted with g1's loss. The same drain stays an anomaly when a participant's home lost
    nothing, when one is not the workload's transaction of that home, or when the drain holds
    anything else (`drain_parked` None)."""
    stuck = ["g0 still draining after settling: g0 is draining and holds 1 pending transaction(s): ..."]
    lost = ["t1-367 (tx on g1): acknowledged COMMIT, 2 of 2 messages never read"]
    h = history()
    h.add("t1-400", Tx(["t1-400.0", "t1-400.1"], "COMMIT", groups=["g1", "g0"]))  # home g1, participant g0
    h.add("t1-401", Tx(["t1-401.0", "t1-401.1"], "COMMIT", groups=["g2", "g0"]))  # home g2
    a = {"drain stuck": list(stuck)}
    assert _consequences_of_async_loss(a, lost, cluster({"g0": [], "g1": [], "g2": []}), h, {"t1-400": "g1"}) == {
        "drain stuck": stuck}
    assert a == {}
    for held in ({"t1-401": "g2"}, {"t1-400": "g1", "t1-401": "g2"}, {"t9-1": "g1"}, {"t1-401": "g1"}, None, {}):
        a = {"drain stuck": list(stuck)}
        assert _consequences_of_async_loss(a, lost, cluster({"g0": [], "g1": [], "g2": []}), h, held) == {}, held
        assert a == {"drain stuck": stuck}
