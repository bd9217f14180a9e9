"""chaos/checker.py's judgement of a backup under faults (check_backups) and of its restored copy
(check_restored) against the history: a history and a copy written by hand, no broker."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos.backup import classify  # noqa: E402
from chaos.checker import check_backups, check_restored  # noqa: E402
from chaos.reader import Reader  # noqa: E402
from chaos.workload import History, Tx  # noqa: E402

SENT = 100.0  # the backup was asked for then (monotonic)
BACKUP = {"sent": SENT, "manifest": {"id": "b1-x", "group": "g0", "broker": "b1", "epoch": 2, "last_lsn": 90}}


def _tx(h: History, key: str, bodies: list[str], acked: str = "", at: float = 0.0, **kw) -> Tx:
    tx = Tx(bodies, kw.pop("intended", acked or "COMMIT"), acked=acked, acked_at=at,
            topics=["Orders"] * len(bodies), **kw)
    h.add(key, tx)
    return tx


def _world():
    """g0 served t1 (acked before), t2 (acked after), t3 (rolled back: never visible), s1 (spanning
    g0+g1, acked before) and job member j1-m0 (job committed, acked before); g1 served t9."""
    h = History()
    _tx(h, "t1", ["t1.0", "t1.1"], "COMMIT", 50.0, groups=["g0"])
    _tx(h, "t2", ["t2.0"], "COMMIT", 150.0, groups=["g0"])
    _tx(h, "t3", ["t3.0"], "ROLLBACK", 60.0, groups=["g0"])
    _tx(h, "s1", ["s1.0", "s1.1"], "COMMIT", 70.0, groups=["g1", "g0"])
    _tx(h, "j1-m0", ["job1.0"], "COMMIT", 80.0, kind="member", job="j1", groups=["g0"])
    _tx(h, "t9", ["t9.0"], "COMMIT", 40.0, groups=["g1"])
    h.decisions.append((0.0, "j1", "COMMITTED"))
    reader = Reader(lambda: {})
    for pos, body in {("g0", "Orders", 0, 0): "t1.0", ("g0", "Orders", 0, 1): "t1.1", ("g0", "Orders", 0, 2): "s1.1",
                      ("g0", "Orders", 0, 3): "job1.0", ("g0", "Orders", 0, 4): "t2.0",
                      ("g1", "Orders", 0, 0): "s1.0", ("g1", "Orders", 0, 1): "t9.0",
                      ("g0", "%DLQ%chaos-cg", 0, 0): "t1.0"}.items():  # (as poison is: seen twice live, once stored)
        reader.seen[pos] = body
    restored = {"seen": {("Orders", 0, 0): "t1.0", ("Orders", 0, 1): "t1.1", ("Orders", 0, 2): "s1.1",
                         ("Orders", 0, 3): "job1.0"},
                "starts": {("Orders", 0): 0}, "pending": [], "jobs": {"j1": "COMMITTED"}}
    return h, reader, restored


def test_a_copy_holding_the_acknowledged_prefix_passes():
    h, reader, restored = _world()
    found, counts = check_restored(h, reader, BACKUP, restored)
    assert found == {}
    assert counts["acknowledged before the backup"] == 3 and counts["checked present"] == 4  # t9 is g1's
    restored["seen"][("Orders", 0, 4)] = "t2.0"  # acknowledged after it was asked for: may be there
    assert check_restored(h, reader, BACKUP, restored)[0] == {}


def test_an_acknowledged_commit_missing_is_lost_unless_retention_had_deleted_it():
    h, reader, restored = _world()
    for pos in (("Orders", 0, 0), ("Orders", 0, 1)):
        del restored["seen"][pos]
    found, _ = check_restored(h, reader, BACKUP, restored)
    assert list(found) == ["restored lost"] and "t1 (tx)" in found["restored lost"][0], found
    restored["starts"][("Orders", 0)] = 2  # the copy's log starts after them: deleted before the backup
    found, counts = check_restored(h, reader, BACKUP, restored)
    assert found == {} and counts["unverified (retention before the backup)"] == 1


def test_a_spanning_part_or_job_member_may_be_undecided_but_not_gone():
    h, reader, restored = _world()
    del restored["seen"][("Orders", 0, 2)]
    del restored["seen"][("Orders", 0, 3)]
    restored["pending"] = ["s1", "j1-m0"]
    found, counts = check_restored(h, reader, BACKUP, restored)
    assert found == {} and counts["undecided in the copy"] == 2
    restored["pending"] = ["s1"]
    found, _ = check_restored(h, reader, BACKUP, restored)
    assert list(found) == ["restored lost"] and "j1-m0" in found["restored lost"][0], found


def test_phantoms_duplicates_torn_moved_and_a_changed_decision():
    h, reader, restored = _world()
    restored["seen"].update({("Orders", 0, 5): "t3.0", ("Orders", 0, 6): "nobody.0", ("Orders", 0, 7): "t1.0"})
    del restored["seen"][("Orders", 0, 1)]
    restored["seen"][("Orders", 0, 8)] = "job1.0"
    del restored["seen"][("Orders", 0, 3)]
    restored["jobs"] = {"j1": "ABORTED"}
    found, _ = check_restored(h, reader, BACKUP, restored)
    assert sorted(found) == ["restored decision", "restored duplicate", "restored moved", "restored phantom",
                             "restored torn"], found
    assert len(found["restored phantom"]) == 2  # t3 rolled back, nobody.0 never sent
    assert "t1.0" in found["restored duplicate"][0] and "t1 (tx)" in found["restored torn"][0]
    assert "job1.0" in found["restored moved"][0] and "j1 ABORTED" in found["restored decision"][0]


def test_an_undecided_job_in_the_copy_is_no_anomaly_and_an_unreadable_copy_is():
    h, reader, restored = _world()
    restored["jobs"] = {"j1": "PREPARED"}
    found, counts = check_restored(h, reader, BACKUP, restored)
    assert found == {} and counts["jobs undecided in the copy"] == 1
    found, _ = check_restored(h, reader, BACKUP, {"error": "restore exited 1: boom"})
    assert list(found) == ["restored unreadable"]


def test_backup_outcomes_a_refusal_must_say_why():
    say = "txbroker backup: slave b1 is not in sync with its master 10.0.0.2:10911: not connected (x) (NOT_IN_SYNC)"
    assert classify(1, say) == ("refused", say)
    assert classify(1, "txbroker backup: admin API at http://x unreachable: timed out")[0] == "unreachable"
    assert classify(1, "txbroker backup: broker error (INTERNAL)")[0] == "failed"
    assert classify(1, "txbroker backup: Server got itself in trouble (500)")[0] == "failed"   # seed 282, before
    full = "txbroker backup: no room for the checkpoint in /d: IO error: No space left on device (NO_SPACE)"
    assert classify(1, full) == ("refused", full)
    assert check_backups([{"group": "g2", "target": "b7", "at_s": 70.3, "exit_code": 1, "outcome": "refused",
                           "reason": full}]) == {}
    damaged = ("txbroker backup: broker b2's store is damaged, so no backup was made (the broker stops and is seeded "
               "from its master): /d/.snapshots/x is damaged: Corruption: block checksum mismatch (STORE_DAMAGED)")
    assert classify(1, damaged) == ("refused", damaged)  # seed 571: a refusal that says why
    assert check_backups([{"group": "g0", "target": "b2", "at_s": 44.0, "exit_code": 1, "outcome": "refused",
                           "reason": damaged}]) == {}
    assert classify(0, "") == ("taken", "")
    base = {"group": "g0", "target": "b1", "at_s": 3.0, "exit_code": 1}
    ok = [{**base, "outcome": "refused", "reason": say}, {**base, "outcome": "unreachable", "reason": "timed out"},
          {**base, "outcome": "taken", "reason": "", "exit_code": 0}]
    assert check_backups(ok) == {}
    bad = [{**base, "outcome": "refused", "reason": "no (NOT_IN_SYNC)"},
           {**base, "outcome": "failed", "reason": "Traceback"},
           {**base, "outcome": "unreachable", "reason": "timed out", "left_whole": True}]
    assert len(check_backups(bad)["backup failed"]) == 3


def test_a_hole_retention_left_above_a_kept_record_is_unverified_not_lost():
    """Retention keeps the records live state derives from: a job member's at offset 3 stays while
    t1's older messages at 0-1 go, so the copy's queue still starts at 0 (seeds 73-83: 'restored
    lost' for commits acknowledged 21-25 s before the backup, retention 20 s). What retention may
    have deleted before the checkpoint is unverified; a newer commit missing is still lost."""
    h, reader, restored = _world()
    for pos in (("Orders", 0, 0), ("Orders", 0, 1)):
        del restored["seen"][pos]
    backup = {**BACKUP, "answered": SENT + 2.0}
    found, _ = check_restored(h, reader, backup, restored)
    assert "restored lost" in found  # without retention: t1 acknowledged 50 s before is missing
    found, counts = check_restored(h, reader, backup, restored, retention_s=50.0)
    assert found == {} and counts["unverified (retention before the backup)"] == 1, (found, counts)
    del restored["seen"][("Orders", 0, 3)]  # j1-m0 acknowledged at 80: inside the 50 s retention, so lost
    found, _ = check_restored(h, reader, backup, restored, retention_s=50.0)
    assert [d for d in found["restored lost"] if "j1-m0" in d], found
    # a clock set ahead makes retention delete sooner: 30 s ahead puts j1-m0 past the horizon too
    found, _ = check_restored(h, reader, backup, restored, retention_s=50.0, clock_ahead_s=30.0)
    assert found == {}, found
