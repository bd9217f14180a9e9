"""Store format 6: what a half send's messages share is stored once, and read back on every message.

- a HalfRecord's properties are written once and every message decodes with them under its own;
- a pending transaction keeps its messages' queues as runs and their keys as one list, and a
  format-5 entry (a pair per message) reads as the same;
- the key index and the queue offsets come out as they did per message.
"""

from __future__ import annotations

import msgspec

from txbroker.protocol.bodies import Message
from txbroker.store import keys
from txbroker.store.records import (
    HalfRecord, PendingTx, decode_pending, decode_record, encode, keys_of, runs_of,
)

SHARED = {"txbroker.spark.job": "job-seven", "txbroker.spark.attempt": "3"}


def test_a_half_records_shared_properties_are_stored_once_and_read_on_every_message():
    msgs = [Message("T", b"a", keys="k1", queue_id=0), Message("T", b"b", queue_id=0),
            Message("T", b"c", properties={"txbroker.spark.attempt": "mine", "x": "1"}, queue_id=1)]
    raw = encode(HalfRecord("t1", "g", 1, msgs, properties=SHARED))
    assert raw.count(b"job-seven") == 1
    r = decode_record(raw)
    assert [m.properties for m in r.messages] == [SHARED, SHARED, {**SHARED, "txbroker.spark.attempt": "mine", "x": "1"}]
    # a record without shared properties reads as before
    plain = decode_record(encode(HalfRecord("t2", "g", 1, [Message("T", b"a", properties={"p": "1"})])))
    assert plain.messages[0].properties == {"p": "1"}


def test_runs_and_keys_of_messages():
    msgs = [Message("T", b"1", queue_id=0), Message("T", b"2", keys="a", queue_id=0), Message("U", b"3", queue_id=0),
            Message("T", b"4", keys="b c", queue_id=1), Message("T", b"5", queue_id=0)]
    assert runs_of(msgs) == [("T", 0, 2), ("U", 0, 1), ("T", 1, 1), ("T", 0, 1)]
    assert keys_of(msgs) == ["", "a", "", "b c", ""]
    assert keys_of([Message("T", b"1"), Message("T", b"2")]) == []
    assert runs_of([]) == []


class Format5PendingTx(msgspec.Struct, array_like=True, omit_defaults=True):
    """PendingTx as format 5 wrote it: a (topic, queue) pair and a (index, keys) pair per message."""

    transaction_id: str
    producer_group: str
    half_lsn: int
    born_ms: int
    destinations: list[tuple[str, int]]
    immunity_ms: int = 0
    checks: int = 0
    last_check_ms: int = 0
    state: str = "PREPARED"
    keyed: list[tuple[int, str]] = []
    job_id: str = ""


def test_a_format5_pending_transaction_reads_as_runs_and_keys():
    old = Format5PendingTx("t1", "g", 7, 1, [("T", 0), ("T", 0), ("U", 2)], checks=2, keyed=[(1, "k1"), (2, "x y")],
                           job_id="j1")
    p = decode_pending(msgspec.msgpack.encode(old))
    assert (p.runs, p.keys, p.message_count) == ([("T", 0, 2), ("U", 2, 1)], ["", "k1", "x y"], 3)
    assert (p.destinations, p.keyed, p.checks, p.job_id) == ([], [], 2, "j1")
    again = decode_pending(encode(p))  # rewritten as format 6
    assert again == p
    no_keys = decode_pending(msgspec.msgpack.encode(Format5PendingTx("t2", "g", 8, 1, [("T", 1)])))
    assert (no_keys.runs, no_keys.keys) == ([("T", 1, 1)], [])


def _entries_one_by_one(lsn, msgs):
    """The key index as format 5 built it, a message at a time."""
    out = []
    for i, m in enumerate(msgs):
        for key in m.keys.split():
            out.append((m.topic.encode() + b"\x00" + key.encode() + b"\x00" + keys.lsn_key(lsn)
                        + i.to_bytes(4, "big"), i))
    return out


def test_the_key_index_of_runs_is_the_one_made_message_by_message():
    msgs = [Message("T", b"1", keys="a", queue_id=0), Message("T", b"2", queue_id=0),
            Message("U", b"3", keys="b c", queue_id=0), Message("T", b"4", keys="d", queue_id=1),
            Message("T", b"5", keys="e", queue_id=1)]
    assert keys.key_entries(42, runs_of(msgs), keys_of(msgs)) == _entries_one_by_one(42, msgs)


def test_a_pending_transaction_built_from_a_half_record_counts_its_messages():
    msgs = [Message("T", b"a", queue_id=q) for q in (0, 0, 1, 1, 1)]
    p = PendingTx("t", "g", 1, 1, runs=runs_of(msgs), keys=keys_of(msgs))
    assert p.message_count == 5 and decode_pending(encode(p)) == p
