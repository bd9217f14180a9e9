"""Truncating the log: a rejoining broker drops the records its new master never had.

Everything happens in one WriteBatch: the log records after the kept LSN go, and each family of
derived state (store/derived/) cuts back what they derived, deriving again from the kept log what
they changed; the log's own epochs go with their records. A kill at any point leaves the store as
it was before the truncation or after it, never between, so recovery has nothing to finish (no
marker, no resumable state); the caller reloads memory.

A family derives state again from its kept records, which retention keeps for live state (its
lineage). Retention on this broker never passed what is cut here, except where a slave-less
ASYNC master deleted records its slave never got: then the cut is refused (StoreError), and the
follower has the store seeded from its master at the next start.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from txbroker.store import keys
from txbroker.store.db import StoreError, sync_write_options
from txbroker.store.group_commit import Batch
from txbroker.store.records import EpochRecord, decode_record

if TYPE_CHECKING:
    from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)


def truncate(state: "StateMachine", last_kept: int) -> int:
    """Drop records after `last_kept` and their effects, atomically; returns how many were dropped."""
    db, h = state.db, state.db.handles
    # checked before looking for records to drop: retention may have deleted every one of them (an
    # END at the log's end), and what they derived stays unless the cut is refused
    if last_kept + 1 < min(state.log_complete_from, state.next_lsn):
        raise StoreError(f"cannot truncate after LSN {last_kept}: retention deleted this broker's records up to "
                         f"{state.log_complete_from - 1}, so what they derived cannot be undone: it needs a copy of its "
                         f"master's store")
    dropped = [(keys.lsn_from_key(k), decode_record(raw)) for k, raw in db.log.items(from_key=keys.lsn_key(last_kept + 1))]
    if not dropped:
        return 0
    log.warning("truncating the log after LSN %d: %d records the master does not have", last_kept, len(dropped))
    scratch = Batch(None)  # the families' own apply code writes into this batch
    wb = scratch.wb
    wb.delete_range(keys.lsn_key(last_kept + 1), keys.lsn_key(2**64 - 1), h["log"])
    for lsn, r in dropped:
        if type(r) is EpochRecord:
            wb.delete(b"epoch/" + keys.lsn_key(r.epoch), h["meta"])
    for family in state.families:
        family.cut(dropped, last_kept, scratch)
    wb.delete(b"published", h["meta"])
    db.db.write(wb, sync_write_options())
    log.warning("truncated %d records after LSN %d", len(dropped), last_kept)
    return len(dropped)
