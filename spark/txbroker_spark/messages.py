"""Rows to messages: the body (the row as JSON by default, or one column as bytes / string / JSON),
keys and tags as the write options say; and a digest of what a batch holds."""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import hashlib

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txbroker.protocol.bodies import Message

from txbroker_spark.options import WriteOptions


def _json_default(value):
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


# msgspec writes datetimes as RFC 3339, decimals as strings, bytes as base64, NaN/inf as null.
_encoder = msgspec.json.Encoder(enc_hook=_json_default, decimal_format="string")


def _json_bodies(values: list) -> list[bytes]:
    """Each value as JSON, in one call: JSON text holds no raw newline, so the lines are the values."""
    return _encoder.encode_lines(values).split(b"\n")[:-1]


# Time zones whose timestamps msgspec writes with a "Z" (offset 0): the ones Spark's session time
# zone is set to in practice. Others go through Python datetimes, as before.
_UTC_ZONES = frozenset({"UTC", "Etc/UTC", "Z", "+00:00", "GMT", "Etc/GMT", "Etc/UCT", "UCT", "Universal",
                        "Etc/Universal", "Zulu", "Etc/Zulu"})


# What Python's datetime holds, as microseconds since 1970 (Arrow's values of a "us" timestamp)
_EPOCH = _dt.datetime(1970, 1, 1)
_MIN_US = (_dt.datetime(1, 1, 1) - _EPOCH) // _dt.timedelta(microseconds=1)
_MAX_US = (_dt.datetime(9999, 12, 31, 23, 59, 59, 999999) - _EPOCH) // _dt.timedelta(microseconds=1)


def _timestamp_text(col, t):
    """A microsecond timestamp column (naive or UTC) as the RFC 3339 text msgspec writes for a
    datetime, without its quotes ("2026-01-01T00:00:00Z"; ".123000" only when the microseconds are
    not 0; no "Z" when naive), made by Arrow for the whole column: `to_pylist` otherwise makes a
    Python datetime per value (2.4 us a UTC value against 0.17). None for any other column, and for
    one with a value Python's datetime cannot hold (before year 1 or after 9999), so that it fails
    as before."""
    if not (pa.types.is_timestamp(t) and t.unit == "us" and (t.tz is None or t.tz in _UTC_ZONES)):
        return None
    bounds = pc.min_max(col.cast(pa.int64()))
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or low < _MIN_US or high > _MAX_US:
        return None  # all null (nothing to gain), or out of datetime's range
    # Arrow writes a naive timestamp as "2026-01-01 00:00:00.000000" (a UTC one without its zone:
    # the same wall clock), quickly; a zoned one it formats through the zone database, slowly.
    naive = col.cast(pa.timestamp("us"))
    seconds = naive.cast(pa.timestamp("s"), safe=False)
    if pc.all(pc.equal(seconds.cast(pa.timestamp("us")), naive)).as_py():
        text = seconds.cast(pa.string())  # whole seconds: no fraction to take off
    else:
        text = naive.cast(pa.string())
        if pc.any(pc.ends_with(text, ".000000")).as_py():
            text = pc.replace_substring_regex(text, r"\.000000$", "")
    text = pc.binary_replace_slice(text, start=10, stop=11, replacement="T")  # the years are 4 digits
    return text if t.tz is None else pc.binary_join_element_wise(text, "Z", "")


def _plain(col) -> bool:
    """No value of a string column holds what msgspec escapes (a quote, a backslash, a control
    character); UTF-8 it writes as it is. Looks at the column's bytes, those of any slot included."""
    data = col.buffers()[2]
    if data is None:
        return True
    b = np.frombuffer(data, np.uint8)
    return not ((b < 0x20) | (b == 0x22) | (b == 0x5C)).any()


def _column_json(col) -> tuple["pa.Array", bool]:
    """Each value of an Arrow column as the JSON text msgspec writes for it (a null: "null"), as a
    binary array; and whether that text is a string's without its quotes (no nulls then: the caller
    writes the quotes around every value). Integers, booleans, strings that need no escaping and
    naive or UTC timestamps are formatted by Arrow for the whole column; any other column goes
    through msgspec, a value at a time, which is what msgspec writes by definition."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return _or_null(col.cast(pa.string())), False
    text = col if pa.types.is_string(t) and _plain(col) else _timestamp_text(col, t)
    if text is None:
        return pa.array(_json_bodies(col.to_pylist()), pa.binary()), False
    if not text.null_count:
        return text.cast(pa.binary()), True
    return _or_null(pc.binary_join_element_wise('"', text, '"', "")), False


def _or_null(text) -> "pa.Array":
    return (text.fill_null("null") if text.null_count else text).cast(pa.binary())


def _quoted(col) -> "pa.Array":
    text, bare = _column_json(col)
    return pc.binary_join_element_wise(b'"', text, b'"', b"") if bare else text


def _json_rows(batch) -> list[bytes]:
    """Each row of `batch` as the JSON object msgspec writes for its `to_pylist` dict, byte for byte,
    built a column at a time: the keys written once, each column's values as JSON (`_column_json`),
    joined by Arrow. A dict per row and the Python values in it were most of what turning a row
    into a message cost. Rows with no columns, or with two of one name (a dict keeps the last), go
    the dict way, and so does a batch whose JSON Arrow cannot hold in one array."""
    names = batch.schema.names
    if not names or len(set(names)) != len(names):
        return _json_bodies(batch.to_pylist())
    parts: list = []
    text = b"{"
    try:
        for i, name in enumerate(names):
            column, bare = _column_json(batch.column(i))
            text += (b"," if i else b"") + _encoder.encode(name) + b":" + (b'"' if bare else b"")
            parts += (text, column)
            text = b'"' if bare else b""
        parts.append(text + b"}")
        return pc.binary_join_element_wise(*parts, b"").to_pylist()
    except (pa.ArrowCapacityError, pa.ArrowInvalid):  # a batch's JSON past 2 GiB (32-bit offsets)
        return _json_bodies(batch.to_pylist())


class MessageBuilder:
    """Turns rows into Messages as the options say: body (row as JSON by default, or one column as
    bytes / string / JSON), keys from keyColumn, tags from tagsColumn or a constant. `properties`,
    the same for every message, are not put on each: the publisher sends them once per transaction."""

    def __init__(self, o: WriteOptions, properties: dict[str, str]):
        self.o = o
        self.topic = o.topic
        self.properties = properties

    def _body(self, value, row_number: int) -> bytes:
        """A bodyColumn value as bytes or string (JSON bodies: `_json_bodies`, a batch at a time)."""
        fmt = self.o.body_format
        if value is None:
            raise ValueError(f"txbroker option 'bodyColumn': column {self.o.body_column!r} is null in a row "
                             f"(row {row_number} of this task); a message needs a body")
        elif fmt == "bytes":
            body = bytes(value)
        else:
            body = value.encode()
        if not body:
            raise ValueError(f"txbroker option 'bodyColumn': column {self.o.body_column!r} is empty in a row "
                             f"(row {row_number} of this task); the broker refuses empty bodies")
        return body

    def _bodies(self, values: list, first_row: int) -> list[bytes]:
        if self.o.body_format == "json":  # (never empty, null included: no row to name)
            return _json_bodies(values)
        body = self._body
        return [body(v, first_row + i) for i, v in enumerate(values)]

    def from_arrow(self, batch, first_row: int = 0) -> list[Message]:
        o = self.o
        if o.body_column is None:
            bodies = _json_rows(batch)
        elif o.body_format == "json":
            bodies = _quoted(batch.column(o.body_column)).to_pylist()
        else:
            bodies = self._bodies(batch.column(o.body_column).to_pylist(), first_row)
        keys = batch.column(o.key_column).to_pylist() if o.key_column else None
        tags = batch.column(o.tags_column).to_pylist() if o.tags_column else None
        return self._build(bodies, keys, tags)

    def from_rows(self, rows: list, first_row: int = 0) -> list[Message]:
        o = self.o
        if o.body_column is None:
            bodies = _json_bodies([r.asDict(recursive=True) for r in rows])
        else:
            bodies = self._bodies([r[o.body_column] for r in rows], first_row)
        keys = [r[o.key_column] for r in rows] if o.key_column else None
        tags = [r[o.tags_column] for r in rows] if o.tags_column else None
        return self._build(bodies, keys, tags)

    def _build(self, bodies: list[bytes], keys, tags) -> list[Message]:
        topic, const_tags, n = self.topic, self.o.tags, len(bodies)
        if keys is None:
            keys = [""] * n
        else:
            keys = ["" if k is None else k if type(k) is str else str(k) for k in keys]
        if tags is None:
            tags = [str(const_tags) if const_tags is not None else ""] * n
        else:
            tags = ["" if t is None else str(t) for t in tags]
        return [Message(topic, b, t, k) for b, t, k in zip(bodies, tags, keys)]


def content_hash(msgs: list[Message]) -> str:
    """A digest of what a batch holds: two attempts that send the same rows get the same id."""
    h = hashlib.blake2b(digest_size=8)
    for m in msgs:
        for part in (m.body, m.keys.encode(), m.tags.encode()):
            h.update(len(part).to_bytes(4, "little"))
            h.update(part)
    return h.hexdigest()
