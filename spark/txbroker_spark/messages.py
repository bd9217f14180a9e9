"""Rows to messages: the body (the row as JSON by default, or one column as bytes / string / JSON),
keys and tags as the write options say; and a digest of what a batch holds."""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import hashlib

import msgspec

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


def _timestamps_as_text(batch):
    """`batch` with its top-level microsecond timestamp columns (naive or UTC) as the RFC 3339 text
    msgspec writes for a datetime ("2026-01-01T00:00:00Z"; ".123000" only when the microseconds are
    not 0; no "Z" when naive), made by Arrow for the whole column: `to_pylist` otherwise makes a
    Python datetime per value, most of what turning a row into a message cost (2.4 us a UTC value
    against 0.17). A column with a value Python's datetime cannot hold (before year 1 or after 9999)
    is left as it is, so it fails as before."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = None
    for i, field in enumerate(batch.schema):
        t = field.type
        if not (pa.types.is_timestamp(t) and t.unit == "us" and (t.tz is None or t.tz in _UTC_ZONES)):
            continue
        col = batch.column(i)
        bounds = pc.min_max(col.cast(pa.int64()))
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is None or low < _MIN_US or high > _MAX_US:
            continue  # all null (nothing to gain), or out of datetime's range
        # Arrow writes a naive timestamp as "2026-01-01 00:00:00.000000" (a UTC one without its zone:
        # the same wall clock), quickly; a zoned one it formats through the zone database, slowly.
        text = col.cast(pa.timestamp("us")).cast(pa.string())
        text = pc.replace_substring_regex(pc.replace_substring(text, " ", "T", max_replacements=1), r"\.000000$", "")
        if t.tz is not None:
            text = pc.binary_join_element_wise(text, "Z", "")
        if columns is None:
            columns = list(batch.columns)
        columns[i] = text
    return batch if columns is None else pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


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

    def from_arrow(self, batch, first_row: int = 0) -> list[Message]:
        o = self.o
        n = batch.num_rows
        if o.body_column is None:
            values = _timestamps_as_text(batch).to_pylist()
        else:
            values = batch.column(o.body_column).to_pylist()
        keys = batch.column(o.key_column).to_pylist() if o.key_column else None
        tags = batch.column(o.tags_column).to_pylist() if o.tags_column else None
        return self._build(n, values, keys, tags, first_row)

    def from_rows(self, rows: list, first_row: int = 0) -> list[Message]:
        o = self.o
        if o.body_column is None:
            values = [r.asDict(recursive=True) for r in rows]
        else:
            values = [r[o.body_column] for r in rows]
        keys = [r[o.key_column] for r in rows] if o.key_column else None
        tags = [r[o.tags_column] for r in rows] if o.tags_column else None
        return self._build(len(rows), values, keys, tags, first_row)

    def _build(self, n, values, keys, tags, first_row) -> list[Message]:
        topic, const_tags = self.topic, self.o.tags
        if self.o.body_format == "json":  # (never empty, null included: no row to name)
            bodies = _json_bodies(values)
        else:
            body = self._body
            bodies = [body(values[i], first_row + i) for i in range(n)]
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
