"""Opening the RocksDB database and its column families."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from rocksdict import AccessType, BlockBasedOptions, DBRecoveryMode, Options, Rdict, RdictIter, WriteOptions

from txbroker.store.records import READABLE_FORMATS, STORE_FORMAT_VERSION

log = logging.getLogger(__name__)

COLUMN_FAMILIES = ("log", "cq", "pending", "tx", "meta", "offsets", "keys", "jobs")


class StoreError(Exception):
    """The data directory cannot be used (locked, wrong format, corrupt)."""


class StoreCorrupt(StoreError):
    """RocksDB found the data directory's files damaged (a checksum, a truncated file)."""


def is_corruption(e: BaseException) -> bool:
    """An error RocksDB raised because a file it read is damaged (rocksdict raises bare Exceptions
    with RocksDB's status message)."""
    return isinstance(e, StoreCorrupt) or "Corruption" in str(e) or "truncated block read" in str(e)


def _corrupt(e: BaseException, hooks: list) -> StoreCorrupt:
    err = e if isinstance(e, StoreCorrupt) else StoreCorrupt(f"damaged data: {e}")
    for hook in hooks:
        hook(err)
    return err


class CheckedIter:
    """A RocksDB iterator that raises StoreCorrupt where RocksDB's just stops (it ends an iteration
    at a damaged block as if the data ended there: a read would silently come up short)."""

    __slots__ = ("_it", "_hooks", "key", "value", "next", "prev", "seek", "seek_for_prev", "seek_to_first",
                 "seek_to_last")

    def __init__(self, it: RdictIter, hooks: list):
        self._it, self._hooks = it, hooks
        self.key, self.value, self.next, self.prev = it.key, it.value, it.next, it.prev
        self.seek, self.seek_for_prev, self.seek_to_first, self.seek_to_last = (
            it.seek, it.seek_for_prev, it.seek_to_first, it.seek_to_last)

    def valid(self) -> bool:
        if self._it.valid():
            return True
        try:
            self._it.status()
        except Exception as e:  # noqa: BLE001 - RocksDB's status, raised as a bare Exception
            raise _corrupt(e, self._hooks) from e
        return False


class Column:
    """A column family as the store reads it: RocksDB's, whose reads raise StoreCorrupt (and tell
    `on_corruption`) on a damaged file instead of coming up short."""

    def __init__(self, cf: Rdict, hooks: list):
        self._cf = cf
        self._hooks = hooks  # the database's: told of a damaged file before StoreCorrupt is raised
        self.put, self.delete = cf.put, cf.delete

    def get(self, key, default=None):
        try:
            return self._cf.get(key, default)
        except Exception as e:  # noqa: BLE001 - RocksDB's errors are bare Exceptions
            if is_corruption(e):
                raise _corrupt(e, self._hooks) from e
            raise

    def __getitem__(self, key):
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def iter(self) -> CheckedIter:
        return CheckedIter(self._cf.iter(), self._hooks)

    def items(self, from_key=None, backwards: bool = False):
        it = self.iter()
        if from_key is None:
            it.seek_to_last() if backwards else it.seek_to_first()
        else:
            it.seek_for_prev(from_key) if backwards else it.seek(from_key)
        step = it.prev if backwards else it.next
        while it.valid():
            yield it.key(), it.value()
            step()

    def keys(self, from_key=None):
        for k, _v in self.items(from_key):
            yield k

    def close(self) -> None:
        self._cf.close()
        self._cf = self.put = self.delete = None


@dataclass
class Database:
    db: Rdict
    log: Column
    cq: Column
    pending: Column
    tx: Column
    meta: Column
    offsets: Column
    keys: Column
    jobs: Column
    handles: dict
    on_corruption: list  # told of every damaged file a read meets (the broker stops; a slave is seeded)

    def close(self) -> None:
        # Each column-family handle keeps the database (and its LOCK file) open: close them all.
        for cf in (self.log, self.cq, self.pending, self.tx, self.meta, self.offsets, self.keys, self.jobs):
            cf.close()
        self.handles.clear()
        self.db.close()


# After a crash RocksDB replays the write-ahead log into memtables; capping the WAL makes it
# flush memtables early, so recovery time stays bounded (uncapped: 21 s for 1M transactions).
MAX_TOTAL_WAL_BYTES = 32 * 1024 * 1024
MEMTABLE_BLOOM_RATIO = 0.02


def _options() -> Options:
    opt = Options(raw_mode=True)
    opt.create_if_missing(True)
    opt.create_missing_column_families(True)
    opt.increase_parallelism(2)
    opt.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES)
    # A damaged file is an error, never silently dropped data: a torn last WAL record (a crash in the
    # middle of an unsynced write) is what a crash leaves and is dropped; damage anywhere else stops
    # the open (StoreCorrupt), and a slave then seeds itself from its master (broker/replication/seed.py).
    opt.set_paranoid_checks(True)
    opt.set_wal_recovery_mode(DBRecoveryMode.tolerate_corrupted_tail_records())
    return opt


def _cf_options(name: str) -> Options:
    opt = Options(raw_mode=True)
    if name in ("tx", "pending", "keys", "offsets"):
        # Point lookups that usually miss (is this transaction id new?): a bloom filter answers
        # a miss without reading blocks, so history does not slow down new transactions.
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        opt.set_block_based_table_factory(table)
        # The same for the memtable: a miss there is otherwise a skip-list search of everything
        # written since the last flush, 2-3 us on every half message's "is this id new?"
        # (bench/README.md, 2026-12-07, the memtable's bloom filter). 2 % of the memtable's size.
        opt.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
        opt.set_memtable_whole_key_filtering(True)
    return opt


def open_database(path: str) -> Database:
    os.makedirs(path, exist_ok=True)
    cfs = {name: _cf_options(name) for name in COLUMN_FAMILIES}
    try:
        db = Rdict(path, options=_options(), column_families=cfs)
    except Exception as e:  # rocksdict raises a bare Exception with RocksDB's message
        msg = str(e)
        if is_corruption(e):
            raise StoreCorrupt(f"data directory {path} is damaged: {msg}") from e
        if "lock hold by current process" in msg:
            raise StoreError(f"data directory {path} is already open in this process ({msg})") from e
        if "LOCK" in msg or "lock" in msg.split(":")[0].lower():
            raise StoreError(f"data directory {path} is in use by another broker process ({msg})") from e
        raise StoreError(f"cannot open data directory {path}: {msg}") from e
    hooks: list = []
    parts = {name: Column(db.get_column_family(name), hooks) for name in COLUMN_FAMILIES}
    handles = {name: db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
    database = Database(db=db, handles=handles, on_corruption=hooks, **parts)
    fmt = database.meta.get(b"format")
    found = int(fmt) if fmt is not None else None
    if found not in READABLE_FORMATS and found is not None:
        database.close()
        from txbroker import __version__
        newer = "a newer txbroker wrote it" if found > STORE_FORMAT_VERSION else "an unknown format"
        raise StoreError(f"data directory {path} has store format {found} ({newer}); this broker, txbroker "
                         f"{__version__}, reads {', '.join(map(str, sorted(READABLE_FORMATS)))}: run a version that "
                         "reads it, or restore a backup made before the upgrade (docs/upgrading.md, Rolling back)")
    if found != STORE_FORMAT_VERSION:
        # Mark the store with what this broker writes from now on, so an older broker refuses it
        # instead of misreading the newer entries (the derived families are written in this format).
        if found is not None:
            log.warning("store %s: format %d upgraded to %d in place (a broker older than format %d no longer "
                        "opens it)", path, found, STORE_FORMAT_VERSION, STORE_FORMAT_VERSION)
        database.meta.put(b"format", str(STORE_FORMAT_VERSION).encode(), write_opt=sync_write_options())
    return database


def verify_store(path: str) -> int:
    """Every key and value of every column family of the store at `path` read once from its files,
    by a read-only instance of its own (no block cache shared with a broker running on them, whose
    cache may hold a block as it was before the disk damaged it). RocksDB checks each block's
    checksum as it reads: a damaged file raises StoreCorrupt naming it. Returns the keys read."""
    cfs = {name: _cf_options(name) for name in COLUMN_FAMILIES}
    try:
        db = Rdict(path, options=_options(), column_families=cfs, access_type=AccessType.read_only())
    except Exception as e:  # rocksdict raises a bare Exception with RocksDB's message
        if is_corruption(e):
            raise StoreCorrupt(f"{path} is damaged: {e}") from e
        raise
    n = 0
    try:
        for name in COLUMN_FAMILIES:
            cf = Column(db.get_column_family(name), [])
            try:
                for _k, _v in cf.items():
                    n += 1
            except StoreCorrupt as e:
                raise StoreCorrupt(f"{path} is damaged: {e}") from e
            finally:
                cf.close()
    finally:
        db.close()
    return n


def sync_write_options() -> WriteOptions:
    wo = WriteOptions()
    wo.sync = True
    return wo


def last_key(cf: Column) -> bytes | None:
    it = cf.iter()
    it.seek_to_last()
    return it.key() if it.valid() else None


def last_item_with_prefix(cf: Column, prefix: bytes) -> tuple[bytes, bytes] | None:
    it = cf.iter()
    it.seek_for_prev(prefix + b"\xff" * 8)
    if it.valid():
        key = it.key()
        if key.startswith(prefix):
            return key, it.value()
    return None
