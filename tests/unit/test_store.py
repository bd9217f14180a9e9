"""The store on its own: recovery after close, transaction state, message ids."""

import asyncio

import pytest

from txbroker.client.producer import as_list
from txbroker.protocol.bodies import Message, encode
from txbroker.protocol.codes import TransactionState
from txbroker.store import keys
from txbroker.store.db import StoreError
from txbroker.store.reads import MessageReader
from txbroker.store.records import STORE_FORMAT_VERSION, EndRecord, HalfRecord, NormalRecord
from txbroker.store.state import StateMachine


def test_close_releases_the_store_and_recovery_sees_everything(tmp_path):
    async def main():
        s = StateMachine(str(tmp_path), True, lambda e: None)
        _, durable = s.append(HalfRecord("t1", "g", 1, [Message("T", b"a", queue_id=0), Message("T", b"b", queue_id=1)]))
        s.append(HalfRecord("t2", "g", 1, [Message("T", b"c", queue_id=0)]))
        s.append_to_queues([("T", 0, 1), ("T", 1, 1)], lambda offsets: EndRecord("t1", 1, TransactionState.COMMIT, 2, offsets))
        await durable
        await s.close()
        again = StateMachine(str(tmp_path), True, lambda e: None)  # same process: the LOCK was released
        assert {p.transaction_id for p in again.pending_transactions()} == {"t2"}
        assert again.finished("t1").state == "COMMITTED" and again.finished("t1").queue_offsets == [0, 0]
        assert again.next_lsn == 4
        assert again.queue_end("T", 0) == 1 and again.queue_end("T", 1) == 1
        await again.close()

    asyncio.run(main())


def test_message_ids_are_stable_and_parse_back():
    assert keys.msg_ids(0x2A, 3) == [keys.msg_id(0x2A, i) for i in range(3)]
    assert keys.parse_msg_id(keys.msg_id(123456, 7)) == (123456, 7)
    assert len(keys.msg_ids(5, 2000)) == 2000


def test_a_resent_message_does_not_carry_its_old_transaction_id():
    m = Message("T", b"x")
    plain = encode(m)
    m.transaction_id = "abc"  # what a transactional send leaves on the caller's message
    (again,) = as_list(m)
    assert encode(again) == plain


def _commit(s: StateMachine, txid: str, msgs: list[Message]) -> asyncio.Future:
    """Prepare and commit as TransactionService does."""
    lsn, _ = s.append(HalfRecord(txid, "g", 1, msgs))
    _, _, durable = s.append_to_queues([("T", 0, len(msgs))],
                                       lambda offsets: EndRecord(txid, lsn, TransactionState.COMMIT, 2, offsets))
    return durable


def test_a_committed_batch_is_one_index_entry_read_from_anywhere_in_it(tmp_path):
    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        await _commit(s, "a", [Message("T", b"a%d" % i, queue_id=0) for i in range(100)])
        await _commit(s, "b", [Message("T", b"b%d" % i, queue_id=0) for i in range(50)])
        assert len(list(s.db.cq.keys())) == 2  # one entry per committed run, not per message
        reader = MessageReader(s)
        msgs, nxt, end = reader.read_queue("T", 0, 37, 10)  # inside the first run
        assert [m.body for m in msgs] == [b"a%d" % i for i in range(37, 47)] and (nxt, end) == (47, 150)
        msgs, nxt, _ = reader.read_queue("T", 0, 95, 10)  # across the two runs
        assert [m.body for m in msgs] == [b"a%d" % i for i in range(95, 100)] + [b"b%d" % i for i in range(5)]
        assert [m.queue_offset for m in msgs] == list(range(95, 105)) and nxt == 105
        assert reader.read_queue("T", 0, 150, 10)[0] == []
        await s.close()
        again = StateMachine(str(tmp_path), False, lambda e: None)
        assert again.queue_end("T", 0) == 150  # the last run's end, not its first offset
        await again.close()

    asyncio.run(main())


def test_a_format_1_store_is_read_and_marked_format_2_and_an_unknown_format_refused(tmp_path):
    async def main():
        s = StateMachine(str(tmp_path), True, lambda e: None)
        await _commit(s, "a", [Message("T", b"m%d" % i, queue_id=0) for i in range(3)])
        # rewrite the index as format 1 did: one 12-byte entry per message
        prefix = keys.queue_prefix("T", 0)
        ((key, value),) = list(s.db.cq.items())
        lsn, index, count = keys.cq_run_decode(value)
        s.db.cq.delete(key)
        for i in range(count):
            s.db.cq.put(keys.cq_key(prefix, i), keys.cq_value(lsn, index + i))
        s.db.meta.put(b"format", b"1")
        await s.close()

        old = StateMachine(str(tmp_path), True, lambda e: None)
        assert old.db.meta.get(b"format") == str(STORE_FORMAT_VERSION).encode()
        assert old.queue_end("T", 0) == 3
        assert [m.body for m in MessageReader(old).read_queue("T", 0, 1, 10)[0]] == [b"m1", b"m2"]
        old.db.meta.put(b"format", b"99")
        await old.close()
        with pytest.raises(StoreError, match=r"data directory .+ has store format 99 \(a newer txbroker wrote it\); "
                                             r"this broker, txbroker .+, reads 1, 2, 3, 4, 5"):
            StateMachine(str(tmp_path), True, lambda e: None)

    asyncio.run(main())


def test_a_record_whose_offsets_are_not_consecutive_is_indexed_message_by_message(tmp_path):
    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        msgs = [Message("T", b"m%d" % i, queue_id=0) for i in range(3)]
        _, durable = s.append(NormalRecord(1, msgs, [0, 2, 3]))  # a gap at offset 1: no single run
        await durable
        assert len(list(s.db.cq.keys())) == 3
        got = MessageReader(s).read_queue("T", 0, 0, 10)[0]
        assert [(m.queue_offset, m.body) for m in got] == [(0, b"m0"), (2, b"m1"), (3, b"m2")]
        await s.close()

    asyncio.run(main())


def test_a_queues_start_is_not_taken_from_offsets_reserved_but_not_yet_written(tmp_path):
    """The fault harness, seeds 465 and 471: a consumer's first pull came between a queue's first
    commit (offsets reserved) and its write; the queue's start was taken as 2 and kept, so the
    consumer was told offset 0 was deleted and skipped two messages that were there."""
    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        _, _, durable = s.append_messages(1, [Message("T", b"a", queue_id=0), Message("T", b"b", queue_id=0)])
        assert s.queue_start("T", 0) == 0  # reserved, not written
        await durable
        assert s.queue_start("T", 0) == 0
        await s.close()

    asyncio.run(main())


def test_offsets_a_restarted_master_never_had_confirmed_are_answered_once_a_slave_has_them(tmp_path):
    """A SYNC master killed with offset commits no slave confirmed when it last wrote: whether a
    slave confirmed them later, and readers saw them, is unknown after the restart. Read as before
    them, an offset can move backwards (the fault harness, seed 19, CI); read as stored, one a
    failover then takes away (seed 19 before). So readers get the stored value once a slave has it."""
    from txbroker.store.records import OffsetRecord

    async def main():
        s = StateMachine(str(tmp_path), True, lambda e: None)
        s.append(OffsetRecord("cg", [("T", 0, 5)]))
        await s.drain()
        s.replication_hold = lambda batch: None  # a SYNC master whose slaves confirm nothing more
        s.replication_wait = lambda lsn: asyncio.get_running_loop().create_future()
        s.append(OffsetRecord("cg", [("T", 0, 9)]))
        s.append(OffsetRecord("cg", [("T", 1, 4)]))  # a queue the group never committed before
        await s.drain()
        assert (s.committed_offset("cg", "T", 0), s.committed_offset("cg", "T", 1)) == (5, None)
        assert s.offset_for_reader("cg", "T", 0) == (5, 0)  # this run knows nobody read 9
        tail = s.next_lsn - 1
        await s.close()

        again = StateMachine(str(tmp_path), True, lambda e: None)
        assert again.offset_for_reader("cg", "T", 0) == (9, tail - 1)
        assert again.offset_for_reader("cg", "T", 1) == (4, tail)
        assert again.committed_offset("cg", "T", 0, published=False) == 9  # the broker's own view
        again.publish_all()  # a slave has them now
        assert (again.offset_for_reader("cg", "T", 0), again.offset_for_reader("cg", "T", 1)) == ((9, 0), (4, 0))
        await again.close()

    asyncio.run(main())


def test_a_record_that_cannot_be_applied_leaves_nothing_of_its_batch_and_stops_the_store(tmp_path):
    """Second review, defect 5: a failure while applying a record left the record in the write batch
    and the log end moved, while replication never shipped it (the slave still looked in sync and
    every SYNC write after it timed out). Now the batch is not written at all: its requests are
    refused, the store stops (the broker recovers from disk), and the log is as before the batch."""
    from txbroker.store.state import ApplyError

    fatal = []

    async def main():
        s = StateMachine(str(tmp_path), True, fatal.append)
        await s.append(HalfRecord("t1", "g", 1, [Message("T", b"kept", queue_id=0)]))[1]
        _, same_batch = s.append(HalfRecord("t2", "g", 1, [Message("T", b"in the failed batch", queue_id=0)]))
        with pytest.raises(ApplyError) as e:
            s.append_to_queues([("T", 0, 1)], lambda offsets: EndRecord("never-prepared", 9, TransactionState.COMMIT, 2,
                                                                      offsets))
        assert "EndRecord" in str(e.value)
        with pytest.raises(ApplyError):
            await same_batch
        assert len(fatal) == 1
        with pytest.raises(RuntimeError):  # stopped: nothing more is taken
            s.append(HalfRecord("t3", "g", 1, [Message("T", b"after", queue_id=0)]))
        await s.close()

    asyncio.run(main())

    async def reopen():
        again = StateMachine(str(tmp_path), True, lambda e: None)
        assert again.next_lsn == 2 and {p.transaction_id for p in again.pending_transactions()} == {"t1"}
        await again.close()

    asyncio.run(reopen())


def test_a_stored_half_message_with_an_unreadable_immunity_applies_as_unset(tmp_path):
    """A record an older broker admitted (before CHECK_IMMUNITY_TIME_IN_SECONDS was checked at the
    door) must still apply, on replay and on a slave: it reads as no immunity."""
    async def main():
        s = StateMachine(str(tmp_path), True, lambda e: None)
        await s.append(HalfRecord("t1", "g", 1, [Message("T", b"x", properties={
            "CHECK_IMMUNITY_TIME_IN_SECONDS": "30s"}, queue_id=0)]))[1]
        assert s.pending_transaction("t1").immunity_ms == 0
        await s.close()

    asyncio.run(main())
