"""Consumer groups' committed offsets (the offsets column family: each key's offset and the LSN of the
OffsetRecord that set it), and what readers may be told of them.

A reader is told an offset only once it is published: a commit the slaves do not hold yet (a
failover can take it away) reads as the value before it, so no reader sees an offset that later
moves back. After a restart, offsets the unconfirmed tail set are held from readers until a slave
has them (see `hide_writes`).

Retention keeps each key's newest OffsetRecord (lineage, as Kafka's compacted __consumer_offsets
keeps each key's newest value); truncation takes each key a dropped record set from the newest
kept record that sets it.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Callable

from txbroker.store import keys
from txbroker.store.derived.family import Family
from txbroker.store.derived.latest import walk_back
from txbroker.store.records import OffsetRecord

if TYPE_CHECKING:
    from txbroker.store.db import Database
    from txbroker.store.group_commit import Batch

_VALUE = struct.Struct(">QQ")


def _decode(v: bytes) -> tuple[int, int]:
    """(offset, LSN that set it); format 4 stored the offset alone."""
    if len(v) == 8:
        return keys.lsn_from_key(v), 0
    return _VALUE.unpack(v)


class Offsets(Family):
    def __init__(self, db: "Database", durable_lsn: Callable[[], int]):
        self._db = db
        self._h = db.handles["offsets"]
        self._durable = durable_lsn
        self._set_at: dict[bytes, int] = {}  # key -> LSN of its newest record (the lineage)
        # written but not published: key -> (the value readers see, last write's LSN)
        self._unpublished: dict[bytes, tuple[int | None, int]] = {}
        # after a restart, set by the tail no slave confirmed: key -> last write's LSN
        self._unconfirmed: dict[bytes, int] = {}

    def appliers(self):
        return {OffsetRecord: self.apply}

    def load(self) -> None:
        self._unpublished.clear()
        self._unconfirmed.clear()
        self._set_at = {k: lsn for k, v in self._db.offsets.items() if (lsn := _decode(v)[1])}

    def apply(self, r: OffsetRecord, lsn: int, b: "Batch") -> None:
        put, h = b.wb.put, self._h
        shadow = self._unpublished
        durable = self._durable()
        value = _VALUE.pack
        for topic, queue, offset in r.offsets:
            k = keys.offset_key(r.consumer_group, topic, queue)
            before = shadow.get(k)
            # readers keep the value from before the first write of this key not yet published
            shadow[k] = (before[0] if before and before[1] > durable else self.stored(k), lsn)
            put(k, value(offset, lsn), h)
            self._set_at[k] = lsn

    # ---- reading ---------------------------------------------------------------------------------

    def stored(self, k: bytes) -> int | None:
        v = self._db.offsets.get(k)
        return _decode(v)[0] if v is not None else None

    def committed(self, group: str, topic: str, queue_id: int, published: bool = True) -> int | None:
        """The group's offset as published: a commit the slaves do not hold yet (unacknowledged under
        SYNC replication, and a failover can take it away) is not read, so no reader sees an offset
        that later moves backwards. `published=False`: as written (the broker's own progress, which
        goes on from its own unpublished writes). Readers ask `for_reader`."""
        k = keys.offset_key(group, topic, queue_id)
        shadow = self._unpublished.get(k) if published else None
        if shadow is not None:
            if shadow[1] > self._durable():
                return shadow[0]
            del self._unpublished[k]
        return self.stored(k)

    def written_at(self, group: str, topic: str, queue_id: int) -> int:
        """The LSN of the record that set the group's offset as written (0: none): a commit that
        finds its offset already written is acknowledged once that is published."""
        return self._set_at.get(keys.offset_key(group, topic, queue_id), 0)

    def for_reader(self, group: str, topic: str, queue_id: int) -> tuple[int | None, int]:
        """The group's offset for a reader, and the LSN its answer must wait for to be published (0:
        none). That is an offset a restart left unconfirmed (`hide_writes`): answered as stored,
        once a slave holds it."""
        k = keys.offset_key(group, topic, queue_id)
        unsure = self._unconfirmed.get(k)
        if unsure is not None:
            if unsure > self._durable():
                shadow = self._unpublished.get(k)
                return self.stored(k), max(unsure, shadow[1] if shadow is not None else 0)
            del self._unconfirmed[k]
        return self.committed(group, topic, queue_id), 0

    def all_published(self):
        """(group, topic, queue id, offset) of every committed consumer offset, as published (what
        `committed` answers): the metrics' consumer lag, read when Prometheus scrapes."""
        out = []
        durable = self._durable()
        for k, v in self._db.offsets.items():
            group, _, rest = k.partition(b"\x00")
            shadow = self._unpublished.get(k)
            offset = shadow[0] if shadow is not None and shadow[1] > durable else _decode(v)[0]
            if offset is None:
                continue
            out.append((group.decode(), rest[:-3].decode(), keys.queue_id_of(rest[-2:]), offset))
        return out

    def hide_writes(self, writes: dict[bytes, int], published: int) -> None:
        """Consumer offsets the unconfirmed tail wrote are answered to nobody until a slave has them.
        Whether readers saw them before the kill is unknown: the published LSN is recorded with each
        write, and slaves may have confirmed more after the last one (the fault harness, seed 19:
        read as of the recorded LSN, an offset read 10 lower than just before the kill; read as
        stored, one no slave held, which a failover then took away)."""
        self._unconfirmed.update((k, lsn) for k, lsn in writes.items() if lsn > published)

    def forget_unpublished(self) -> None:
        self._unpublished.clear()
        self._unconfirmed.clear()

    # ---- retention and truncation ------------------------------------------------------------------

    def lineage(self):
        return set(self._set_at.values())

    def cut(self, dropped, last_kept: int, scratch: "Batch") -> None:
        wanted = {(r.consumer_group, t, q) for _lsn, r in dropped if type(r) is OffsetRecord for t, q, _ in r.offsets}
        if not wanted:
            return
        wb, h = scratch.wb, self._h
        groups = {g for g, _t, _q in wanted}
        for lsn, r in walk_back(self._db, last_kept, lambda r: type(r) is OffsetRecord and r.consumer_group in groups):
            for topic, queue, offset in r.offsets:
                if (r.consumer_group, topic, queue) in wanted:
                    wanted.discard((r.consumer_group, topic, queue))
                    wb.put(keys.offset_key(r.consumer_group, topic, queue), _VALUE.pack(offset, lsn), h)
            if not wanted:
                break
        for group, topic, queue in wanted:  # set only by dropped records
            wb.delete(keys.offset_key(group, topic, queue), h)
