"""The shape every family of derived state has (store/derived/__init__.py says why)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    from rocksdict import WriteBatch

    from txbroker.store.group_commit import Batch
    from txbroker.store.records import Record

Applier = Callable[["Record", int, "Batch"], None]


class RetentionPass:
    """One retention pass: deleting (most) records before `cutoff_lsn` (a mark's), at `now_ms`,
    all but the records in `kept` (the mark's lineages; None: not deleting, the log says what is
    stored)."""

    __slots__ = ("now_ms", "cutoff_lsn", "kept")

    def __init__(self, now_ms: int, cutoff_lsn: int, kept: frozenset[int] | None = None):
        self.now_ms = now_ms
        self.cutoff_lsn = cutoff_lsn
        self.kept = kept


class Family:
    """One family of state derived from the log. The defaults do nothing: a family says only what
    concerns it."""

    def appliers(self) -> dict[type, Applier]:
        """The record types this family derives from, each with the method that applies it."""
        return {}

    def load(self) -> None:
        """Memory from disk: at recovery, and after a truncation rewrote the family on disk."""

    def written(self, b: "Batch") -> None:
        """Batch `b` is on the local disk: what memory held of it for readers is there now."""

    def lineage(self) -> Iterable[int]:
        """LSNs of the records live state is derived from: retention keeps them (taken at a mark)."""
        return ()

    def forget(self, lsn: int, record: "Record", wb: "WriteBatch", p: RetentionPass) -> None:
        """Retention deletes record `lsn` (in no lineage): what it derived goes too, into `wb`."""

    def expire(self, wb: "WriteBatch", p: RetentionPass) -> int:
        """Retention's pass, after deleting the records before its cutoff: state that outlives its
        records (decisions, jobs) goes by its own rule. Returns how many entries went."""
        return 0

    def cut(self, dropped: list[tuple[int, "Record"]], last_kept: int, scratch: "Batch") -> None:
        """Truncation: the records `dropped` (after `last_kept`, in LSN order) never happened; their
        effects go, into `scratch.wb` (the one WriteBatch of the truncation)."""
