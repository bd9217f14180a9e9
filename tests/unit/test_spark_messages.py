"""Rows to message bodies (txbroker_spark/messages.py): the timestamps Arrow formats for a whole
column come out byte for byte as msgspec writes the Python datetimes `to_pylist` gives, whatever
the value (microseconds or none, before 1970, the first and last instants Python can hold, null),
for naive and UTC columns; other time zones go through datetimes as before."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest

from txbroker_spark.messages import MessageBuilder, _encoder, _timestamps_as_text
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
    assert _timestamps_as_text(batch).column(1).type == pa.string()  # (it did take the fast way)


def test_other_zones_and_units_go_through_datetimes_as_before():
    values = [v for v in instants(50, seed=3) if v is None or 2 <= v.year <= 9998]  # New York's local time of
    # the first and last instants is outside what a datetime holds: that failed before, and still does
    for batch in (batch_of(values, "America/New_York"),
                  pa.record_batch({"at": pa.array([v for v in values if v], pa.timestamp("ms", tz="UTC"))})):
        assert _timestamps_as_text(batch) is batch
        builder = MessageBuilder(WriteOptions(brokers=["x:1"], topic="T", group="g"), {})
        assert [m.body for m in builder.from_arrow(batch)] == reference_bodies(batch)


def test_a_column_of_nulls_is_left_alone():
    batch = batch_of([None, None], "UTC")
    assert _timestamps_as_text(batch) is batch
