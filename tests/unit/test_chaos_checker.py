"""chaos/checker.py on hand-built histories: each anomaly of issue 30's checker (a job torn across
groups, a read of a member never committed, an offset going back, a key's order broken, a decision
that changed) is reported, and a clean history reports nothing. A stand-in reader, no broker."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos import checker  # noqa: E402
from chaos.workload import History, Tx  # noqa: E402


def reader(member_jobs: dict | None = None, **topics: dict[str, list[tuple]]):
    """topic -> body -> positions (group, queue, offset) the end-of-run reader found it at;
    `member_jobs`: a member's body -> the job properties it was read with (None: each with its own job)."""
    return SimpleNamespace(bodies=lambda topic: topics.get(topic, {}), queues_groups=lambda: ["g0", "g1"],
                           skipped={}, rewritten=[], went_back=[], stuck=[], member_jobs=member_jobs,
                           key_lost=[], key_phantom=[])


def job(h: History, name: str, members: dict[str, tuple[str, str]], acked: str = "COMMIT") -> None:
    """members: txid -> (group, intended decision)."""
    h.jobs[name] = "g0"
    for txid, (group, intended) in members.items():
        h.add(txid, Tx([f"{txid}.0"], intended, acked=acked if intended != "ROLLBACK" else "", kind="member",
                       job=name, groups=[group], topics=["Orders"]))


def check(h: History, r) -> dict[str, list[str]]:
    if r.member_jobs is None:
        r.member_jobs = {b: {tx.job} for tx in h.txs.values() if tx.kind == "member" for b in tx.bodies}
    return checker.check(h, r, {}, {})


def test_a_clean_history_reports_nothing():
    h = History()
    job(h, "j1", {"j1-a": ("g0", "COMMIT"), "j1-b": ("g1", "COMMIT"), "j1-out": ("g1", "ROLLBACK")})
    h.add("t1", Tx(["t1.0", "t1.1"], "COMMIT", acked="COMMIT", groups=["g0", "g1"], topics=["Orders", "Billing"]))
    r = reader(Orders={"j1-a.0": [("g0", 0, 1)], "j1-b.0": [("g1", 0, 1)], "t1.0": [("g0", 1, 4)]},
               Billing={"t1.1": [("g1", 2, 9)]})
    assert check(h, r) == {}


def test_a_job_read_on_one_group_and_not_the_other_is_torn():
    h = History()
    job(h, "j1", {"j1-a": ("g0", "COMMIT"), "j1-b": ("g1", "COMMIT")})
    got = check(h, reader(Orders={"j1-a.0": [("g0", 0, 1)]}))
    assert got["torn"] == ["job j1 (members on g0+g1): 1 of its 2 kept members read"]
    assert "lost" in got  # and the acknowledged member never read is lost


def test_a_member_left_out_of_its_job_that_is_read_is_a_phantom():
    h = History()
    job(h, "j1", {"j1-a": ("g0", "COMMIT"), "j1-out": ("g1", "ROLLBACK")})
    got = check(h, reader(Orders={"j1-a.0": [("g0", 0, 1)], "j1-out.0": [("g1", 0, 3)]}))
    assert got["phantom"] == ["j1-out (member on g1): decided ROLLBACK, read j1-out.0"]


def test_a_member_read_without_its_jobs_property_has_lost_its_properties():
    h = History()
    job(h, "j1", {"j1-a": ("g0", "COMMIT"), "j1-b": ("g1", "COMMIT")})
    got = check(h, reader(member_jobs={"j1-a.0": {"j1"}, "j1-b.0": {None, "j1"}},  # read without it, then with
                          Orders={"j1-a.0": [("g0", 0, 1)], "j1-b.0": [("g1", 0, 1)]}))
    assert got == {"properties lost": ["j1-b (member of job j1 on g1): read with j1-b.0 chaos.job=None"]}


def test_a_message_no_client_sent_is_a_phantom_and_one_stored_twice_a_duplicate():
    h = History()
    h.add("p1", Tx(["p1"], "COMMIT", acked="COMMIT", kind="plain", groups=["g0"], topics=["Plain"]))
    got = check(h, reader(Plain={"p1": [("g0", 0, 1), ("g0", 0, 2)], "p9": [("g1", 0, 1)]}))
    assert got["duplicate"] == ["p1 stored 2 times"] and got["phantom"] == ["p9: read, never sent"]


def test_a_committed_offset_read_lower_than_before_has_regressed():
    h = History()
    h.offsets += [(100.0, "g0", "chaos-cg", 1, 40, "g0-0"), (101.0, "g0", "chaos-cg", 1, 42, "g0-0"),
                  (102.5, "g0", "chaos-cg", 1, 41, "g0-1"), (102.6, "g1", "chaos-cg", 1, 5, "g1-0")]
    got = checker._offsets(h)
    assert len(got["offset regressed"]) == 1
    assert got["offset regressed"][0].startswith("g0 chaos-cg queue 1: committed offset 41 read from g0-1")
    assert "1.5 s after 42 from g0-0" in got["offset regressed"][0]


def ordered(h: History, key: str, placements: dict[int, tuple[str, int] | None]) -> None:
    for n, where in placements.items():
        tx = Tx([f"ord-{key}-{n}"], "COMMIT", acked="COMMIT", kind="ordered", topics=["Ordered"])
        if where:
            tx.groups, tx.queue_ids = [where[0]], [where[1]]
        h.add(f"ord-{key}-{n}", tx)


def test_a_key_delivered_out_of_order_within_one_queue_is_order_broken_even_after_a_route_change():
    h = History()
    ordered(h, "k0", {1: ("g0", 3), 2: ("g0", 3), 3: ("g0", 3)})
    h.ordered_deliveries["k0"] += [1, 3, 2, 3]
    got = checker.check_groups(h, reader(), route_changed=True)
    assert got["order broken"] == ["key k0: first delivered 3 before 2 (1 pairs)"]


def test_a_reordering_across_a_move_of_the_key_is_counted_apart():
    h = History()
    ordered(h, "k1", {1: ("g0", 3), 2: ("g0", 3), 3: ("g1", 0), 4: ("g0", 3)})  # moved to g1, and back
    h.ordered_deliveries["k1"] += [3, 1, 2, 4]
    got = checker.check_groups(h, reader(), route_changed=True)
    assert "order broken" not in got
    assert got["reordered where the key moved"] == ["key k1: first delivered 3 before 1, 3 before 2 (2 pairs)"]
    h.ordered_deliveries["k1"][:] = [3, 1, 4, 2]  # 4 before 2 on the same queue: broken, move or not
    assert checker.check_groups(h, reader(), route_changed=True)["order broken"] == [
        "key k1: first delivered 4 before 2 (1 pairs)"]


def test_a_reordering_of_a_send_whose_queue_is_unknown_is_broken_unless_the_route_changed():
    h = History()
    ordered(h, "k2", {1: ("g0", 3), 2: None})  # 2's send went unanswered: its queue unknown
    h.ordered_deliveries["k2"] += [2, 1]
    assert "order broken" in checker.check_groups(h, reader(), route_changed=False)
    assert "reordered after a route change" in checker.check_groups(h, reader(), route_changed=True)


def test_a_job_answered_committed_then_aborted_is_a_decision_that_changed():
    h = History()
    h.decisions += [(1.0, "j1", "OPEN"), (2.0, "j1", "COMMITTED"), (3.0, "j1", "ABORTED")]
    job(h, "j2", {"j2-a": ("g0", "COMMIT")})  # the coordinator acknowledged COMMIT ...
    h.decisions += [(4.0, "j2", "ABORTED")]  # ... and its home later answered ABORTED
    assert checker._decisions(h) == {"decision changed": [
        "job j1: its home answered ABORTED and COMMITTED",
        "job j2: the coordinator was acknowledged COMMIT; its home later answered ABORTED"]}


def test_a_message_retention_deleted_before_it_was_as_old_as_the_retention_was_deleted_young():
    """Seed 150's kind: retention deleted messages 4-10 s after they were written under 20 s; the
    consumer skipping them was excused as retention, whatever their age."""
    h = History()
    for name, created in (("old", 100.0), ("young", 115.0)):
        h.add(name, Tx([f"{name}.0"], "COMMIT", acked="COMMIT", groups=["g0"], topics=["Orders"], created_at=created))
        h.consumed[f"{name}.0"] = 0
    skip = ("chaos-cg", "g0", "Orders", 0, 0, 2)  # both deleted before chaos-cg got to offsets 0-1
    h.skipped.add(skip)
    h.skipped_seen[skip] = 124.0  # first seen then: 24 s after "old" was sent, 9 s after "young"
    r = reader(Orders={"old.0": [("g0", 0, 0)], "young.0": [("g0", 0, 1)]})
    got = checker.check_groups(h, r, False, retention_s=20.0)
    assert got["deleted young"] == ["young.0: deleted by retention 9.0s or less after it was sent (retention 20s)"]
    assert len(got["skipped by retention"]) == 2 and "group lost" not in got
    assert "deleted young" not in checker.check_groups(h, r, False)  # retention not known: not judged


def test_a_spanning_transaction_read_on_one_group_only_is_torn():
    h = History()
    h.add("t7", Tx(["t7.0", "t7.1"], "COMMIT", acked="COMMIT", groups=["g0", "g1"], topics=["Orders", "Billing"]))
    got = check(h, reader(Orders={"t7.0": [("g0", 0, 3)]}))
    assert got["torn"] == ["t7 on g0+g1: 1 of 2 messages read (t7.0)"]


def test_a_member_of_an_aborted_job_that_is_read_is_a_phantom():
    h = History()
    job(h, "j3", {"j3-a": ("g0", "ROLLBACK"), "j3-b": ("g1", "ROLLBACK")})
    for m in ("j3-a", "j3-b"):
        h.ack(m, "ROLLBACK")   # the coordinator's abort was acknowledged
    got = check(h, reader(Orders={"j3-b.0": [("g1", 0, 8)]}))
    assert [x.split(":")[0] for x in got["phantom"]] == ["j3-b (member on g1)"]


def test_a_job_whose_abort_was_acknowledged_and_later_answered_committed_is_a_decision_that_changed():
    h = History()
    job(h, "j4", {"j4-a": ("g0", "ROLLBACK")})
    h.ack("j4-a", "ROLLBACK")
    h.decisions.append((1.0, "j4", "COMMITTED"))
    assert check(h, reader())["decision changed"] == [
        "job j4: the coordinator was acknowledged its abort; its home later answered COMMITTED"]
