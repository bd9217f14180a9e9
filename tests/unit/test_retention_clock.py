"""Retention and delayed delivery against a clock set back (the fault harness, seed 150: a slave's
clock 30 s behind under 20 s retention; its marks stamped 30 s early looked old once the clock was
right, retention deleted records 2-10 s old, and after its promotion the delay queue's cursor, moved
by how many entries it delivered, fell short of those it had passed over and delivered the last ones
again on every pass). The marks on a real store; the delay queue's cursor on a stand-in broker."""

from __future__ import annotations

from types import SimpleNamespace

from txbroker.broker.schedule_service import ScheduleService
from txbroker.protocol.bodies import Message
from txbroker.protocol.names import PROPERTY_DELIVER_MS, PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC
from txbroker.store.db import open_database
from txbroker.store.derived.marks import Mark, Marks, choose_cutoff


def test_a_mark_stamped_by_a_clock_set_back_never_lets_retention_past_a_younger_one():
    marks = [Mark(1_000, 10, 0, []), Mark(975, 20, 0, []), Mark(976, 30, 0, []), Mark(1_006, 40, 0, [])]
    # 20 ms retention at 1,010: the mark at LSN 10 (1,000) is young, so nothing after it may go,
    # though the two stamped 25 ms back look old
    assert choose_cutoff(marks, 1_010, 20, 0, 0, 10 ** 9) is None
    assert choose_cutoff(marks, 1_021, 20, 0, 0, 10 ** 9).lsn == 30  # once the LSN-10 mark is old
    assert choose_cutoff(marks, 1_030, 20, 0, 0, 10 ** 9).lsn == 40


def test_marks_are_never_stamped_before_the_newest(tmp_path):
    db = open_database(str(tmp_path / "store"))
    try:
        marks = Marks(db)
        marks.take(1_000, 10, 0, [])
        assert marks.take(970, 20, 0, []).ms == 1_001  # the clock set back 30 ms
        assert [(m.ms, m.lsn) for m in marks.all()] == [(1_000, 10), (1_001, 20)]
    finally:
        db.close()


def entry(offset: int) -> SimpleNamespace:
    return SimpleNamespace(queue_offset=offset, body=b"m%d" % offset, tags="", keys="",
                           properties={PROPERTY_DELIVER_MS: "0", PROPERTY_REAL_TOPIC: "%RETRY%cg"})


def test_the_delay_cursor_goes_past_the_last_entry_delivered_when_retention_deleted_some_before_it():
    stored: list[Message] = []
    state = SimpleNamespace(topics={"%RETRY%cg"}, append_messages=lambda now, msgs, *a: stored.extend(msgs),
                            append=lambda record: None)
    queue = {2: [entry(5), entry(6)]}  # entries 2-4 deleted by retention: the read passes over them
    reader = SimpleNamespace(read_queue=lambda topic, q, start, n: (
        [e for e in queue.get(q, []) if e.queue_offset >= start], None, None))
    service = ScheduleService(SimpleNamespace(state=state, reader=reader, topics=None), [1_000, 2_000, 3_000])
    service._next = {0: 0, 1: 0, 2: 2}
    assert service.deliver_due() == 2 and service._next[2] == 7
    assert service.deliver_due() == 0 and [m.body for m in stored] == [b"m5", b"m6"]  # each once
    assert all(m.topic == "%RETRY%cg" for m in stored) and SCHEDULE_TOPIC not in {m.topic for m in stored}
