"""Key codecs for the column families (layout documented in records.py)."""

from __future__ import annotations

import struct

_U64 = struct.Struct(">Q")
_CQ_VALUE = struct.Struct(">QI")
_QUEUE = struct.Struct(">H")

lsn_key = _U64.pack

# the jobs column family: a job by id, and the newest job of each name
JOB_ID_PREFIX = b"id/"
JOB_NAME_PREFIX = b"name/"
# the meta column family: a producer group's transaction settings (GroupSettingsRecord)
GROUP_SETTINGS_PREFIX = b"config/group/"


def group_settings_key(group: str) -> bytes:
    return GROUP_SETTINGS_PREFIX + group.encode()


def lsn_from_key(key: bytes) -> int:
    return _U64.unpack(key)[0]


def queue_prefix(topic: str, queue_id: int) -> bytes:
    return topic.encode() + b"\x00" + _QUEUE.pack(queue_id)


def queue_id_of(packed: bytes) -> int:
    """The queue id at the end of a queue prefix (queue_prefix's last two bytes)."""
    return _QUEUE.unpack(packed)[0]


def cq_key(prefix: bytes, offset: int) -> bytes:
    return prefix + _U64.pack(offset)


def cq_offset(key: bytes) -> int:
    return _U64.unpack_from(key, len(key) - 8)[0]


cq_value = _CQ_VALUE.pack  # (LSN, index in that record): the key index's suffix
cq_value_decode = _CQ_VALUE.unpack

_CQ_RUN = struct.Struct(">QII")
cq_run_value = _CQ_RUN.pack  # (LSN, index of the run's first message in that record, message count)


def cq_run_decode(value: bytes) -> tuple[int, int, int]:
    """A queue-index value: a run of `count` messages; store format 1 wrote one per message."""
    if len(value) == _CQ_VALUE.size:
        lsn, index = _CQ_VALUE.unpack(value)
        return lsn, index, 1
    return _CQ_RUN.unpack(value)


def msg_id(lsn: int, index: int) -> str:
    """A message's id: where its body is stored. Stable from half send through commit."""
    return f"{lsn:016X}{index:04X}"


_SUFFIXES = [f"{i:04X}" for i in range(1024)]


def msg_ids(lsn: int, count: int) -> list[str]:
    """The ids of a record's `count` messages (one format for the prefix, not one per message)."""
    prefix = f"{lsn:016X}"
    if count <= len(_SUFFIXES):
        return [prefix + sfx for sfx in _SUFFIXES[:count]]
    return [f"{prefix}{i:04X}" for i in range(count)]


def parse_msg_id(text: str) -> tuple[int, int]:
    if len(text) != 20:
        raise ValueError(f"message id {text!r} must be 20 hex digits")
    try:
        return int(text[:16], 16), int(text[16:], 16)
    except ValueError:
        raise ValueError(f"message id {text!r} must be 20 hex digits") from None


def offset_key(group: str, topic: str, queue_id: int) -> bytes:
    return group.encode() + b"\x00" + queue_prefix(topic, queue_id)


def key_index_prefix(topic: str, key: str) -> bytes:
    return topic.encode() + b"\x00" + key.encode() + b"\x00"


_U32 = struct.Struct(">I").pack
_INDEXES = [_U32(i) for i in range(1024)]  # a message's index in its record, packed once (most records are smaller)


def key_entries(lsn: int, runs, texts: list[str]) -> list[tuple[bytes, int]]:
    """The key-index keys of record `lsn`'s keyed messages: (key, message index) pairs. `runs`:
    (topic, queue, count) of its messages in order; `texts`: each message's keys ("": none). (A
    commit of keyed messages pays this per message: the topic's part and the LSN are encoded once.)"""
    out = []
    append = out.append
    lsn_part = b"\x00" + _U64.pack(lsn)
    start = 0
    for topic, _queue, n in runs:
        head = topic.encode() + b"\x00"
        end = start + n
        for i in range(start, end):
            text = texts[i]
            if not text:
                continue
            tail = lsn_part + (_INDEXES[i] if i < 1024 else _U32(i))
            if " " in text:
                for key in text.split():
                    append((head + key.encode() + tail, i))
            else:
                append((head + text.encode() + tail, i))
        start = end
    return out


def send_back_key(group: str, msg_id: str, reconsume_times: int) -> bytes:
    """Meta key of a consumer group's send-back of one message after its Nth failure."""
    return b"sendback/%s\x00%s\x00%d" % (group.encode(), msg_id.encode(), reconsume_times)
