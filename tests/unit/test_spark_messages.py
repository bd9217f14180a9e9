"""Rows to message bodies (txbroker_spark/messages.py): what Arrow formats a column at a time comes
out byte for byte as msgspec writes the row dicts `to_pylist` gives. Timestamps, whatever the value
(microseconds or none, before 1970, the first and last instants Python can hold, null), for naive
and UTC columns; other time zones go through datetimes as before. Every other column type, with
nulls, values msgspec escapes, sliced batches, and a row or a bodyColumn of each."""

from __future__ import annotations

import datetime as dt
import decimal
import random

import pyarrow as pa
import pytest

from txbroker_spark.messages import MessageBuilder, _encoder, _timestamp_text
from txbroker_spark.options import WriteOptions

EDGES = [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(1969, 12, 31, 23, 59, 59),
         dt.datetime(1970, 1, 1), dt.datetime(2026, 1, 1, 0, 0, 0, 1), dt.datetime(2026, 6, 30, 12, 30, 45, 120000),
         dt.datetime(999, 2, 3, 4, 5, 6, 7)]


def instants(n: int, seed: int) -> list[dt.datetime | None]:
    rnd = random.Random(seed)
    span = (dt.datetime(9999, 12, 31) - dt.datetime(1, 1, 1)) // dt.timedelta(microseconds=1)
    out: list[dt.datetime | None] = list(EDGES)
    for _ in range(n):
        t = dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rnd.randrange(span))
        out.append(t.replace(microsecond=0) if rnd.random() < 0.3 else t)
    out.append(None)
    return out


def reference_bodies(batch: pa.RecordBatch) -> list[bytes]:
    """What the builder wrote before Arrow formatted timestamps: msgspec over to_pylist's rows, one
    at a time."""
    return [_encoder.encode(row) for row in batch.to_pylist()]


def batch_of(values, tz) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(len(values)), pa.int64()),
                            "at": pa.array(values, pa.timestamp("us", tz=tz)),
                            "name": pa.array([f"row-{i}" for i in range(len(values))])})


@pytest.mark.parametrize("tz", [None, "UTC", "Etc/UTC"])
def test_formatted_timestamps_are_the_bodies_msgspec_wrote(tz):
    batch = batch_of(instants(2000, seed=7), tz)
    builder = MessageBuilder(WriteOptions(brokers=["x:1"], topic="T", group="g"), {})
    bodies = [m.body for m in builder.from_arrow(batch)]
    assert bodies == reference_bodies(batch)
    assert b'"at":"0001-01-01T00:00:00' in bodies[0] and b'"at":null' in bodies[-1]
    at = batch.column("at")
    assert _timestamp_text(at, at.type) is not None  # (it did take the fast way)


def test_other_zones_and_units_go_through_datetimes_as_before():
    values = [v for v in instants(50, seed=3) if v is None or 2 <= v.year <= 9998]  # New York's local time of
    # the first and last instants is outside what a datetime holds: that failed before, and still does
    for batch in (batch_of(values, "America/New_York"),
                  pa.record_batch({"at": pa.array([v for v in values if v], pa.timestamp("ms", tz="UTC"))})):
        at = batch.column("at")
        assert _timestamp_text(at, at.type) is None
        builder = MessageBuilder(WriteOptions(brokers=["x:1"], topic="T", group="g"), {})
        assert [m.body for m in builder.from_arrow(batch)] == reference_bodies(batch)


def test_a_column_of_nulls_is_left_alone():
    batch = batch_of([None, None], "UTC")
    assert _timestamp_text(batch.column("at"), batch.column("at").type) is None


def every_type(n: int, seed: int) -> pa.RecordBatch:
    """A column of each kind a Spark row can hold, a tenth of the values null."""
    rnd = random.Random(seed)

    def maybe(make):
        return [None if rnd.random() < 0.1 else make(i) for i in range(n)]

    text = ["plain", "", 'a "quote"', "back\\slash", "tab\there", "line\nbreak", "\x00\x1f\x7f", "é ü 😀 \u2028",
            "</script>", "{json}"]
    floats = [0.0, -0.0, 1.0, 100.0, 12.5, 0.1, 1e15, 1e16, 1e20, 1.2345678901234568e17, 1e-7, 5e-324,
              1.7976931348623157e308, float("nan"), float("inf"), float("-inf")]
    stamps = instants(n, seed)[:n]
    return pa.record_batch({
        "i8": pa.array(maybe(lambda i: rnd.randint(-128, 127)), pa.int8()),
        "i64": pa.array(maybe(lambda i: rnd.choice([0, -1, 2**63 - 1, -2**63, rnd.getrandbits(40)])), pa.int64()),
        "u64": pa.array(maybe(lambda i: rnd.choice([0, 2**64 - 1, rnd.getrandbits(50)])), pa.uint64()),
        "flag": pa.array(maybe(lambda i: rnd.random() < 0.5), pa.bool_()),
        "plain": pa.array([f"o-{i:09d}" for i in range(n)]),  # no null, nothing escaped: the quotes in the keys
        "plain_nulls": pa.array(maybe(lambda i: f"c-{i}")),
        "escaped": pa.array(maybe(lambda i: rnd.choice(text))),
        "big": pa.array(maybe(lambda i: rnd.choice(text)), pa.large_string()),
        "f64": pa.array(maybe(lambda i: rnd.choice(floats + [rnd.uniform(-1e9, 1e9)])), pa.float64()),
        "f32": pa.array(maybe(lambda i: rnd.uniform(-10, 10)), pa.float32()),
        "money": pa.array(maybe(lambda i: decimal.Decimal(rnd.randint(-10**9, 10**9)) / 100), pa.decimal128(12, 2)),
        "day": pa.array(maybe(lambda i: dt.date(1 + rnd.randrange(9999), 1 + rnd.randrange(12), 1)), pa.date32()),
        "raw": pa.array(maybe(lambda i: bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(5)))), pa.binary()),
        "tags": pa.array(maybe(lambda i: [rnd.randint(0, 9) for _ in range(rnd.randrange(3))]), pa.list_(pa.int32())),
        "nested": pa.array(maybe(lambda i: {"k": rnd.choice(text), "v": rnd.random()}),
                           pa.struct([("k", pa.string()), ("v", pa.float64())])),
        "props": pa.array(maybe(lambda i: [("a", rnd.randint(0, 5))]), pa.map_(pa.string(), pa.int64())),
        "whole_utc": pa.array([None if v is None else v.replace(microsecond=0) for v in stamps], pa.timestamp("us", tz="UTC")),
        "naive": pa.array(stamps, pa.timestamp("us")),
        "utc_no_null": pa.array([v or dt.datetime(2026, 1, 1) for v in stamps], pa.timestamp("us", tz="UTC")),
        "whole_no_null": pa.array([dt.datetime(2026, 1, 1) + dt.timedelta(seconds=i) for i in range(n)],
                                  pa.timestamp("us", tz="Etc/UTC")),
        "ny": pa.array([dt.datetime(2026, 1, 1) + dt.timedelta(hours=i) for i in range(n)],
                       pa.timestamp("us", tz="America/New_York")),
        "ms": pa.array([dt.datetime(2026, 1, 1) + dt.timedelta(milliseconds=i) for i in range(n)], pa.timestamp("ms")),
        "nothing": pa.nulls(n, pa.string()),
        'say "hi"\n': pa.array(range(n), pa.int16()),  # a column name msgspec escapes
    })


@pytest.mark.parametrize("seed", [1, 2])
def test_rows_of_every_column_type_are_the_bodies_msgspec_wrote(seed):
    batch = every_type(600, seed)
    builder = MessageBuilder(WriteOptions(brokers=["x:1"], topic="T", group="g"), {})
    assert [m.body for m in builder.from_arrow(batch)] == reference_bodies(batch)
    part = batch.slice(37, 200)  # columns whose values start inside their buffers
    assert [m.body for m in builder.from_arrow(part)] == reference_bodies(part)


def test_a_json_body_column_of_each_type_is_what_msgspec_wrote():
    batch = every_type(300, seed=5)
    for name in batch.schema.names:
        builder = MessageBuilder(WriteOptions(brokers=["x:1"], topic="T", group="g", body_column=name), {})
        assert [m.body for m in builder.from_arrow(batch)] == [_encoder.encode(v) for v in batch.column(name).to_pylist()], name


def test_columns_of_one_name_go_the_dict_way():
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2]), pa.array(["a", "b"])], names=["x", "x"])
    builder = MessageBuilder(WriteOptions(brokers=["x:1"], topic="T", group="g"), {})
    assert [m.body for m in builder.from_arrow(batch)] == reference_bodies(batch) == [b'{"x":"a"}', b'{"x":"b"}']


def test_a_batch_whose_json_arrow_cannot_hold_goes_the_dict_way(monkeypatch):
    """Past 2 GiB of JSON in one batch Arrow's 32-bit offsets overflow (it raises): those rows go
    the dict way, byte for byte the same (the overflow stood in for by the join raising it)."""
    import pyarrow.compute as pc

    batch = every_type(50, seed=9)

    def overflow(*args, **kwargs):
        raise pa.ArrowCapacityError("array cannot contain more than 2147483646 bytes")

    monkeypatch.setattr(pc, "binary_join_element_wise", overflow)
    builder = MessageBuilder(WriteOptions(brokers=["x:1"], topic="T", group="g"), {})
    assert [m.body for m in builder.from_arrow(batch)] == reference_bodies(batch)
