"""A slave's side of a backup (the admin API's /api/v1/backups; docs/backup.md): a consistent copy
of its store, a RocksDB checkpoint, with a manifest (store/backup.py), which the `txbroker backup
create` command fetches file by file and drops.

Only a slave in sync with its master makes one: connected, heard from its master within a few
heartbeats, and holding everything its master had published when it last spoke. A master is asked
nothing (the copy would cost the group's writer a checkpoint, and a group whose slaves have all
fallen behind has no consistent, current copy to give): it refuses, naming its slaves in sync.

The checkpoint is taken between two writes (writes happen on this loop), so the manifest's log
position is exact: the copy holds every record through `last_lsn` and the state derived from them,
nothing after. It lives under `<data dir>/.snapshots/backup-<id>` (hard links, on the store's
filesystem) until dropped, or for IDLE_S after its last use.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import secrets
import shutil
import time
from pathlib import Path

from txbroker import __version__
from txbroker.store import seed
from txbroker.store.backup import Manifest, check_name, describe_files
from txbroker.store.db import StoreCorrupt
from txbroker.store.records import STORE_FORMAT_VERSION
from txbroker.store.verify import verify_elsewhere

log = logging.getLogger(__name__)

PREFIX = "backup-"
IDLE_S = 600  # a backup nobody fetched from for this long is dropped
FRESH_HEARTBEATS = 3  # a master not heard from for longer is not one a slave is in sync with


class BackupRefused(Exception):
    """Not made, and why (HTTP status, code)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code = status, code


class BackupService:
    def __init__(self, broker):
        self._b = broker
        self._open: dict[str, tuple[Manifest, float]] = {}  # id -> (manifest, last used)
        # a backup being made or fetched when the broker stopped is nobody's now
        for old in Path(broker.config.data_dir, seed.SNAPSHOTS).glob(PREFIX + "*"):
            shutil.rmtree(old, ignore_errors=True)

    def why_not_in_sync(self) -> str:
        """Why this broker may not make a backup now ("" if it may)."""
        b = self._b
        if b.role.is_master:
            slaves = [f"{s.name} ({s.address})" for s in b.leader.status() if s.in_sync]
            where = ("its slaves in sync: " + ", ".join(slaves)) if slaves else "it has no slave in sync"
            return (f"broker {b.config.broker_name} is the master of its group; a backup is taken from a slave in "
                    f"sync ({where})")
        f = b.follower
        if f is None:
            return f"broker {b.config.broker_name} is a slave with no master to follow"
        return f.out_of_sync(FRESH_HEARTBEATS)

    async def create(self) -> Manifest:
        self._expire()
        why = self.why_not_in_sync()
        if why:
            raise BackupRefused(409, "NOT_IN_SYNC", why)
        state = self._b.state
        await state.drain()
        why = self.why_not_in_sync()  # (the loop ran meanwhile)
        if why:
            raise BackupRefused(409, "NOT_IN_SYNC", why)
        # From here to the checkpoint nothing awaits: no write lands in between.
        name = self._b.config.broker_name
        backup_id = f"{name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"
        last = state.local_durable_lsn
        epochs = [(e, start) for e, start in state.epochs if start <= last]
        published = min(state.publish_limit if state.publish_limit is not None else last, last)
        pending, parked = self._b.transactions.counts()
        jobs = sum(1 for _ in state.iter_jobs())
        log_start = state.log_complete_from
        try:
            target = state.checkpoint(PREFIX + backup_id)
        except Exception as e:  # noqa: BLE001 - RocksDB's errors come as bare Exceptions (an OSError from mkdir)
            seed.drop_snapshot(self._b.config.data_dir, PREFIX + backup_id)
            if "No space left" in str(e) or getattr(e, "errno", None) == errno.ENOSPC:
                raise BackupRefused(507, "NO_SPACE", f"no room for the checkpoint in {self._b.config.data_dir}: "
                                                     f"{e}") from e
            raise BackupRefused(500, "STORE_ERROR", f"the checkpoint could not be written: {e}") from e
        try:
            files = await asyncio.to_thread(describe_files, target)
            # Then read back, every block with its checksum: a block the running store's cache holds
            # undamaged may be damaged on disk, and the copy is its file (the fault harness, seed
            # 571). Hashed first, so damage after the read cannot pass for the checked copy.
            await verify_elsewhere(str(target))
        except StoreCorrupt as e:
            seed.drop_snapshot(self._b.config.data_dir, PREFIX + backup_id)
            self._b.corrupted(e, "a backup's read of the store met a damaged file")
            raise BackupRefused(500, "STORE_DAMAGED", f"broker {name}'s store is damaged, so no backup was made "
                                                      f"(the broker stops and is seeded from its master): {e}") from e
        except BaseException:
            seed.drop_snapshot(self._b.config.data_dir, PREFIX + backup_id)
            raise
        why = self.why_not_in_sync()  # (promoted, or its master gone, meanwhile)
        if why:
            seed.drop_snapshot(self._b.config.data_dir, PREFIX + backup_id)
            raise BackupRefused(409, "NOT_IN_SYNC", why)
        manifest = Manifest(
            id=backup_id, created_ms=int(time.time() * 1000), group=self._b.cluster.group, broker=name,
            master=self._b.follower.master, epoch=epochs[-1][0] if epochs else 0, epochs=epochs, last_lsn=last,
            published_lsn=published, log_start_lsn=log_start, version=__version__, store_format=STORE_FORMAT_VERSION,
            pending_transactions=pending, parked_transactions=parked, jobs=jobs, files=files)
        self._open[backup_id] = (manifest, time.monotonic())
        log.warning("backup %s: a checkpoint of the store through LSN %d at epoch %d, %d files, %d bytes, held until "
                    "fetched and dropped (or idle for %d s)", backup_id, last, manifest.epoch, len(files),
                    sum(f.size for f in files), IDLE_S)
        return manifest

    def file(self, backup_id: str, name: str) -> Path:
        """A file of an open backup (only its own: a name is never a path)."""
        manifest = self._manifest(backup_id)
        if name not in {f.name for f in manifest.files}:
            check_name(name)
            raise BackupRefused(404, "QUERY_NOT_FOUND", f"backup {backup_id} has no file {name[:80]!r}")
        return Path(self._b.config.data_dir, seed.SNAPSHOTS, PREFIX + backup_id, name)

    def drop(self, backup_id: str) -> None:
        self._manifest(backup_id)
        del self._open[backup_id]
        seed.drop_snapshot(self._b.config.data_dir, PREFIX + backup_id)
        log.info("backup %s fetched and dropped", backup_id)

    def _manifest(self, backup_id: str) -> Manifest:
        self._expire()
        got = self._open.get(backup_id)
        if got is None:
            raise BackupRefused(404, "QUERY_NOT_FOUND", f"no backup {backup_id[:80]!r} on this broker (dropped, "
                                                        f"idle for {IDLE_S} s, or the broker restarted)")
        self._open[backup_id] = (got[0], time.monotonic())
        return got[0]

    def _expire(self) -> None:
        now = time.monotonic()
        for backup_id in [i for i, (_m, used) in self._open.items() if now - used > IDLE_S]:
            del self._open[backup_id]
            seed.drop_snapshot(self._b.config.data_dir, PREFIX + backup_id)
            log.warning("backup %s dropped: not fetched for %d s", backup_id, IDLE_S)
