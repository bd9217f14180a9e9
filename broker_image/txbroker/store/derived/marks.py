"""Retention's marks (meta `mark/<u64 BE ms>`): at every retention pass the broker notes the time, the
next LSN, the log bytes written so far, and the LSNs every family's live state is derived from then
(their lineages); beside each, under `markclock/<u64 BE ms>`, the boot clock then (store/boot_clock.py:
a mark's age is the time that really passed since, whatever the wall clock did). A later pass may
delete the records before a mark's LSN except those. Also kept here: `complete_from` (the log holds
every record from there on) and `kept` (the records before it still kept, as some lineage needed them).

A mark describes the log as it was when it was taken, so it is only as good as that log: a
truncation drops the marks taken on the tail it cuts (one of them said "nothing pending" of a
transaction the cut makes pending again: the second review's defect 7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import msgspec

from rocksdict import WriteBatch

from txbroker.store import keys
from txbroker.store.derived.family import Family

if TYPE_CHECKING:
    from txbroker.store.boot_clock import BootClock
    from txbroker.store.db import Database
    from txbroker.store.group_commit import Batch

MARK_PREFIX = b"mark/"
CLOCK_PREFIX = b"markclock/"  # per mark: [boot id, boot clock ms] when it was taken
COMPLETE_KEY = b"complete_from"  # u64 BE LSN: the log holds every record from here on
KEPT_KEY = b"kept"  # msgpack list of LSNs: the records before complete_from still kept (needed)


class Age(NamedTuple):
    ms: int
    by_boot: bool  # read from the boot clock (true whatever the wall clock did); else from its stamp


class Mark(msgspec.Struct, array_like=True):
    ms: int
    lsn: int  # the next LSN when the mark was taken
    log_bytes: int  # bytes of log records written before it, ever
    needed: list[int]  # LSNs of the records live state was derived from then (format 4: pending halves)


_encode = msgspec.msgpack.Encoder().encode
decode_mark = msgspec.msgpack.Decoder(Mark).decode
_decode_lsns = msgspec.msgpack.Decoder(list[int]).decode
_decode_clock = msgspec.msgpack.Decoder(tuple[str, int]).decode


class Marks(Family):
    def __init__(self, db: "Database"):
        self._db = db
        self._h_meta = db.handles["meta"]

    def take(self, now_ms: int, next_lsn: int, log_bytes: int, needed: list[int], boot: "BootClock") -> Mark:
        # Never stamped before the newest mark, and aged by the boot clock (ages): a clock set back
        # would stamp later records as older than earlier ones, and retention, reading age from the
        # stamps, delete them early (the fault harness, seed 150: a slave 30 s behind, retention
        # 20 s, deleted records 2-10 s old; with stamps alone, still those written while it was behind).
        newest = self.newest()
        if newest is not None and now_ms <= newest.ms:
            now_ms = newest.ms + 1
        m = Mark(now_ms, next_lsn, log_bytes, needed)
        key = keys.lsn_key(now_ms)
        wb = WriteBatch(raw_mode=True)
        wb.put(MARK_PREFIX + key, _encode(m), self._h_meta)
        wb.put(CLOCK_PREFIX + key, _encode((boot.id, boot.now_ms())), self._h_meta)
        self._db.db.write(wb)
        return m

    def ages(self, marks: list[Mark], now_ms: int, boot: "BootClock") -> dict[int, Age]:
        """Each mark's age (by its stamp `ms`): the boot clock's time since it was taken, where it was
        taken on this boot; else the wall clock's (`now_ms` less its stamp)."""
        here, now_boot = boot.id, boot.now_ms()
        out = {}
        for m in marks:
            raw = self._db.meta.get(CLOCK_PREFIX + keys.lsn_key(m.ms))
            taken = _decode_clock(raw) if raw is not None else None
            on_this_boot = taken is not None and taken[0] == here
            out[m.ms] = Age(now_boot - taken[1], True) if on_this_boot else Age(now_ms - m.ms, False)
        return out

    def all(self) -> list[Mark]:
        out = []
        for k, v in self._db.meta.items(from_key=MARK_PREFIX):
            if not k.startswith(MARK_PREFIX):
                break
            out.append(decode_mark(v))
        return out

    def newest(self) -> Mark | None:
        marks = self.all()
        return marks[-1] if marks else None

    def complete_from(self) -> int:
        v = self._db.meta.get(COMPLETE_KEY)
        return keys.lsn_from_key(v) if v is not None else 1

    def kept(self) -> list[int]:
        raw = self._db.meta.get(KEPT_KEY)
        return _decode_lsns(raw) if raw is not None else []

    def record_pass(self, wb, kept: list[int], complete_from: int, drop_before: Mark | None) -> None:
        """What a chunk of a retention pass leaves: the records it kept, where the log is complete
        from, and (its last chunk) the marks older than the one it used, which no pass needs now."""
        h = self._h_meta
        if drop_before is not None:
            for m in self.all():
                if m.lsn < drop_before.lsn:
                    wb.delete(MARK_PREFIX + keys.lsn_key(m.ms), h)
                    wb.delete(CLOCK_PREFIX + keys.lsn_key(m.ms), h)
        wb.put(KEPT_KEY, _encode(sorted(kept)), h)
        wb.put(COMPLETE_KEY, keys.lsn_key(complete_from), h)

    def cut(self, dropped, last_kept: int, scratch: "Batch") -> None:
        """Marks taken on the dropped tail describe a log that no longer is: they go."""
        for k, v in self._db.meta.items(from_key=MARK_PREFIX):
            if not k.startswith(MARK_PREFIX):
                break
            if decode_mark(v).lsn > last_kept + 1:
                scratch.wb.delete(k, self._h_meta)
                scratch.wb.delete(CLOCK_PREFIX + k[len(MARK_PREFIX):], self._h_meta)


def choose_cutoff(all_marks: list[Mark], now_ms: int, retention_ms: int, retention_bytes: int, log_bytes: int,
                  limit_lsn: int, ages: dict[int, Age] | None = None, age_limit_lsn: int | None = None) -> Mark | None:
    """The latest mark before which records may go. By age (`ages`: Marks.ages; a mark not in it is
    aged by its stamp): the last one older than `retention_ms`, never past `age_limit_lsn`. By size
    (`retention_bytes` > 0): the last one after which the log still holds that many bytes (so it
    holds at most `retention_bytes` plus one interval's writes, as Kafka's holds at most
    retention.bytes plus a segment). Never one past `limit_lsn`."""
    usable = sorted((m for m in all_marks if m.lsn <= limit_lsn), key=lambda m: m.lsn)
    chosen = None
    ages = ages or {}
    age_limit = limit_lsn if age_limit_lsn is None else min(limit_lsn, age_limit_lsn)
    young_before = False
    for m in usable:  # in log order
        if m.lsn > age_limit:
            break
        age = ages.get(m.ms) or Age(now_ms - m.ms, False)
        if age.ms < retention_ms:
            if age.by_boot:
                break  # the marks after it are younger still, by the same clock
            young_before = True  # by its stamp: one stamped by a clock since set back looks older than
            continue  # those before it, so only a mark the boot clock calls old may go past it
        if young_before and not age.by_boot:
            continue
        chosen = m
    if retention_bytes > 0:
        by_size = [m for m in usable if log_bytes - m.log_bytes >= retention_bytes]
        if by_size and (chosen is None or by_size[-1].lsn > chosen.lsn):
            chosen = by_size[-1]
    return chosen
