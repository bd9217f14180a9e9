"""Retention and delayed delivery against a clock set back (the fault harness, seed 150: a slave's
clock 30 s behind under 20 s retention; its marks stamped 30 s early looked old once the clock was
right, retention deleted records 2-10 s old, and after its promotion the delay queue's cursor, moved
by how many entries it delivered, fell short of those it had passed over and delivered the last ones
again on every pass). Stamps that never go back were not enough: marks taken while the clock was
behind are stamped just after the last one before, and look old as soon as that one does, so marks
are aged by the boot clock (store/boot_clock.py). The marks on a real store, its boot clock a stand-in;
the delay queue's cursor on a stand-in broker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from txbroker.broker.schedule_service import ScheduleService
from txbroker.protocol.bodies import Message
from txbroker.protocol.names import PROPERTY_DELIVER_MS, PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC
from txbroker.store.boot_clock import BootClock
from txbroker.store.db import open_database
from txbroker.store.derived.marks import Age, Mark, Marks, choose_cutoff

RETENTION_MS = 20_000


class Clocks:
    """A wall clock the test sets, and a boot clock that only the passing of time moves."""

    def __init__(self, wall_ms: int):
        self.real_ms = wall_ms
        self.skew_ms = 0
        self.boot = BootClock("boot-a", clock=lambda: self.real_ms / 1000)

    def wall(self) -> int:
        return self.real_ms + self.skew_ms

    def take(self, marks: Marks, lsn: int) -> Mark:
        return marks.take(self.wall(), lsn, 0, [], self.boot)

    def cutoff(self, marks: Marks) -> Mark | None:
        all_marks = marks.all()
        return choose_cutoff(all_marks, self.wall(), RETENTION_MS, 0, 0, 10 ** 9,
                             marks.ages(all_marks, self.wall(), self.boot))


@pytest.fixture
def marks(tmp_path):
    """The marks family of a real store."""
    db = open_database(str(tmp_path / "store"))
    yield Marks(db)
    db.close()


def test_a_mark_stamped_by_a_clock_set_back_never_lets_retention_past_a_younger_one():
    marks = [Mark(1_000, 10, 0, []), Mark(975, 20, 0, []), Mark(976, 30, 0, []), Mark(1_006, 40, 0, [])]
    # 20 ms retention at 1,010: the mark at LSN 10 (1,000) is young, so nothing after it may go,
    # though the two stamped 25 ms back look old
    assert choose_cutoff(marks, 1_010, 20, 0, 0, 10 ** 9) is None
    assert choose_cutoff(marks, 1_021, 20, 0, 0, 10 ** 9).lsn == 30  # once the LSN-10 mark is old
    assert choose_cutoff(marks, 1_030, 20, 0, 0, 10 ** 9).lsn == 40


def test_marks_are_never_stamped_before_the_newest(marks):
    boot = BootClock()
    marks.take(1_000, 10, 0, [], boot)
    assert marks.take(970, 20, 0, [], boot).ms == 1_001  # the clock set back 30 ms
    assert [(m.ms, m.lsn) for m in marks.all()] == [(1_000, 10), (1_001, 20)]


def test_records_written_while_the_clock_was_behind_are_kept_their_whole_retention_once_it_is_right(marks):
    clocks = Clocks(1_000_000)
    clocks.take(marks, 10)
    clocks.skew_ms = -30_000  # set back 30 s for 24 s: marks every 2 s, each stamped just after the last
    for lsn in range(20, 140, 10):
        clocks.real_ms += 2_000
        clocks.take(marks, lsn)
    clocks.skew_ms = 0
    clocks.real_ms += 2_000  # right again, 26 s after the first mark
    clocks.take(marks, 140)
    # the marks are 26, 24, 22, 20, 18 ... 2 and 0 s old: records before LSN 40 were written 20 s
    # ago or more, those after it less (by their stamps, all but the last look 26 s old)
    assert clocks.cutoff(marks).lsn == 40
    assert choose_cutoff(marks.all(), clocks.wall(), RETENTION_MS, 0, 0, 10 ** 9).lsn == 130
    clocks.real_ms += 10_000
    assert clocks.cutoff(marks).lsn == 90


def test_a_clock_set_ahead_deletes_nothing_early(marks):
    clocks = Clocks(1_000_000)
    clocks.take(marks, 10)
    clocks.real_ms += 1_000
    clocks.skew_ms = 60_000
    clocks.take(marks, 20)
    assert clocks.cutoff(marks) is None  # by the wall clock the first mark is 61 s old; really 1 s
    clocks.real_ms += 19_000
    assert clocks.cutoff(marks).lsn == 10


def test_a_mark_of_another_boot_is_aged_by_the_wall_clock(marks):
    clocks = Clocks(1_000_000)
    clocks.take(marks, 10)  # taken on boot-a; the machine restarts, its boot clock from 0 again
    rebooted = BootClock("boot-b", clock=lambda: 5.0)
    clocks.real_ms += 25_000
    (m,) = marks.all()
    assert marks.ages([m], clocks.wall(), rebooted) == {m.ms: Age(25_000, False)}
    assert marks.ages([m], clocks.wall(), clocks.boot) == {m.ms: Age(25_000, True)}


def test_an_earlier_boots_mark_stamped_by_a_fast_clock_does_not_hold_back_this_boots_old_marks():
    """Marks aged by their stamps stop the walk at a young one (a clock since set back stamps later
    marks older); a mark the boot clock calls old may go past it: every record before it was
    written at least that long ago, whatever came before."""
    marks = [Mark(5_000_000, 10, 0, []), Mark(1_000, 20, 0, []), Mark(1_001, 30, 0, [])]
    ages = {5_000_000: Age(-3_559_000, False), 1_000: Age(36_000, True), 1_001: Age(12_000, True)}
    assert choose_cutoff(marks, 1_500_000, RETENTION_MS, 0, 0, 10 ** 9, ages).lsn == 20
    stamped = {**ages, 1_000: Age(36_000, False)}  # the same, aged by its stamp: held back
    assert choose_cutoff(marks, 1_500_000, RETENTION_MS, 0, 0, 10 ** 9, stamped) is None


def test_retention_by_size_is_not_held_back_by_a_retry_waiting_in_the_delay_queue():
    marks = [Mark(1_000, 10, 1_000, []), Mark(2_000, 20, 2_000, []), Mark(3_000, 30, 3_000, [])]
    now = 100_000  # every mark old
    assert choose_cutoff(marks, now, RETENTION_MS, 0, 3_500, 10 ** 9, age_limit_lsn=15).lsn == 10  # by age: held
    assert choose_cutoff(marks, now, RETENTION_MS, 1_000, 3_500, 10 ** 9, age_limit_lsn=15).lsn == 20  # by size: not


def entry(offset: int) -> SimpleNamespace:
    return SimpleNamespace(queue_offset=offset, body=b"m%d" % offset, tags="", keys="",
                           properties={PROPERTY_DELIVER_MS: "0", PROPERTY_REAL_TOPIC: "%RETRY%cg"})


def test_the_delay_cursor_goes_past_the_last_entry_delivered_when_retention_deleted_some_before_it():
    stored: list[Message] = []
    state = SimpleNamespace(topics={"%RETRY%cg"}, append_messages=lambda now, msgs, *a: stored.extend(msgs),
                            append=lambda record: None)
    queue = {2: [entry(5), entry(6)]}  # entries 2-4 deleted by retention: the read passes over them
    def read_queue(topic, q, start, n):  # as MessageReader's: (messages, next offset, end)
        got = [e for e in queue.get(q, []) if e.queue_offset >= start]
        return got, (got[-1].queue_offset + 1) if got else start, 7
    reader = SimpleNamespace(read_queue=read_queue)
    service = ScheduleService(SimpleNamespace(state=state, reader=reader, topics=None), [1_000, 2_000, 3_000])
    service._next = {0: 0, 1: 0, 2: 2}
    assert service.deliver_due() == 2 and service._next[2] == 7
    assert service.deliver_due() == 0 and [m.body for m in stored] == [b"m5", b"m6"]  # each once
    assert all(m.topic == "%RETRY%cg" for m in stored) and SCHEDULE_TOPIC not in {m.topic for m in stored}
