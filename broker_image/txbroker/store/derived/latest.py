"""Walking the kept log backwards: how a family whose state is "the newest record's value per key"
(topics, consumer offsets, producer groups' settings, job names) derives a key again after a
truncation dropped the record that set it last."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

from txbroker.store import keys
from txbroker.store.records import Record, decode_record

if TYPE_CHECKING:
    from txbroker.store.db import Database


def walk_back(db: "Database", last_kept: int, wanted: Callable[[Record], bool]) -> Iterator[tuple[int, Record]]:
    """(LSN, record) of the records at or before `last_kept`, newest first, that `wanted` accepts.
    The caller stops once it has every key it needs (a family's lineage keeps each key's newest
    record, so the walk finds it unless the key was set only by dropped records)."""
    it = db.log.iter()
    it.seek_for_prev(keys.lsn_key(last_kept))
    while it.valid():
        r = decode_record(it.value())
        if wanted(r):
            yield keys.lsn_from_key(it.key()), r
        it.prev()
