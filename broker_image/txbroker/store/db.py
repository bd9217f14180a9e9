"""Opening the RocksDB database and its column families."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from rocksdict import BlockBasedOptions, Options, Rdict, RdictIter, WriteOptions

from txbroker.store.records import READABLE_FORMATS, STORE_FORMAT_VERSION

log = logging.getLogger(__name__)

COLUMN_FAMILIES = ("log", "cq", "pending", "tx", "meta", "offsets", "keys", "jobs")


class StoreError(Exception):
    """The data directory cannot be used (locked, wrong format, corrupt)."""


@dataclass
class Database:
    db: Rdict
    log: Rdict
    cq: Rdict
    pending: Rdict
    tx: Rdict
    meta: Rdict
    offsets: Rdict
    keys: Rdict
    jobs: Rdict
    handles: dict

    def close(self) -> None:
        # Each column-family handle keeps the database (and its LOCK file) open: close them all.
        for cf in (self.log, self.cq, self.pending, self.tx, self.meta, self.offsets, self.keys, self.jobs):
            cf.close()
        self.handles.clear()
        self.db.close()


# After a crash RocksDB replays the write-ahead log into memtables; capping the WAL makes it
# flush memtables early, so recovery time stays bounded (uncapped: 21 s for 1M transactions).
MAX_TOTAL_WAL_BYTES = 32 * 1024 * 1024


def _options() -> Options:
    opt = Options(raw_mode=True)
    opt.create_if_missing(True)
    opt.create_missing_column_families(True)
    opt.increase_parallelism(2)
    opt.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES)
    return opt


def _cf_options(name: str) -> Options:
    opt = Options(raw_mode=True)
    if name in ("tx", "pending", "keys", "offsets"):
        # Point lookups that usually miss (is this transaction id new?): a bloom filter answers
        # a miss without reading blocks, so history does not slow down new transactions.
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        opt.set_block_based_table_factory(table)
    return opt


def open_database(path: str) -> Database:
    os.makedirs(path, exist_ok=True)
    cfs = {name: _cf_options(name) for name in COLUMN_FAMILIES}
    try:
        db = Rdict(path, options=_options(), column_families=cfs)
    except Exception as e:  # rocksdict raises a bare Exception with RocksDB's message
        msg = str(e)
        if "lock hold by current process" in msg:
            raise StoreError(f"data directory {path} is already open in this process ({msg})") from e
        if "lock" in msg.lower():
            raise StoreError(f"data directory {path} is in use by another broker process ({msg})") from e
        raise StoreError(f"cannot open data directory {path}: {msg}") from e
    parts = {name: db.get_column_family(name) for name in COLUMN_FAMILIES}
    handles = {name: db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
    database = Database(db=db, handles=handles, **parts)
    fmt = database.meta.get(b"format")
    found = int(fmt) if fmt is not None else None
    if found not in READABLE_FORMATS and found is not None:
        database.close()
        raise StoreError(f"data directory {path} has store format {found}; this broker reads "
                         f"{', '.join(map(str, sorted(READABLE_FORMATS)))}")
    if found != STORE_FORMAT_VERSION:
        # Mark the store with what this broker writes from now on, so an older broker refuses it
        # instead of misreading the newer entries.
        if found is not None:
            log.info("store %s: format %d upgraded to %d in place", path, found, STORE_FORMAT_VERSION)
        database.meta.put(b"format", str(STORE_FORMAT_VERSION).encode(), write_opt=sync_write_options())
    return database


def sync_write_options() -> WriteOptions:
    wo = WriteOptions()
    wo.sync = True
    return wo


def last_key(cf: Rdict) -> bytes | None:
    it: RdictIter = cf.iter()
    it.seek_to_last()
    return it.key() if it.valid() else None


def last_item_with_prefix(cf: Rdict, prefix: bytes) -> tuple[bytes, bytes] | None:
    it: RdictIter = cf.iter()
    it.seek_for_prev(prefix + b"\xff" * 8)
    if it.valid():
        key = it.key()
        if key.startswith(prefix):
            return key, it.value()
    return None
