"""A store made anew from a copy of another broker's: how a slave whose own store is damaged, or that
needs records its master's retention deleted, starts again (broker/replication/seed.py fetches the
copy; this module is what happens on disk).

The copy is a RocksDB checkpoint of the master's store: consistent at one instant (hard links of its
table files and a flushed log), taken under `<data dir>/.snapshots/<id>` so that the links stay on
one filesystem (the data directory is often a volume's root, whose parent is not writable). Its
files travel to the slave into `<data dir>/.seeding/`; then the slave's own files are moved aside
into `<data dir>/.damaged/` (the last one kept, for a post-mortem) and the copy's moved in. A marker
file, `RESEED`, says a seed is due: written before anything is replaced and removed once the copy is
in place, so a kill in between seeds again at the next start.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rocksdict import Checkpoint

RESEED = "RESEED"
SNAPSHOTS = ".snapshots"
SEEDING = ".seeding"
DAMAGED = ".damaged"
_OURS = (RESEED, SNAPSHOTS, SEEDING, DAMAGED)


def mark(data_dir: str, why: str) -> None:
    """A seed is due at the next start (`why` is kept in the marker, and logged then)."""
    os.makedirs(data_dir, exist_ok=True)
    tmp = Path(data_dir, RESEED + ".tmp")
    tmp.write_text(why + "\n")
    os.replace(tmp, Path(data_dir, RESEED))
    _sync_dir(data_dir)


def marked(data_dir: str) -> str | None:
    """Why a seed is due, if one is."""
    try:
        return Path(data_dir, RESEED).read_text().strip() or "marked"
    except FileNotFoundError:
        return None


def checkpoint(db, data_dir: str, snapshot_id: str) -> Path:
    """A consistent copy of the open store `db`, under .snapshots/<id>."""
    root = Path(data_dir, SNAPSHOTS)
    root.mkdir(exist_ok=True)
    target = root / snapshot_id
    shutil.rmtree(target, ignore_errors=True)
    Checkpoint(db).create_checkpoint(str(target))
    return target


def snapshot_files(target: Path) -> list[tuple[str, int]]:
    return sorted((f.name, f.stat().st_size) for f in target.iterdir() if f.is_file())


def drop_snapshot(data_dir: str, snapshot_id: str) -> None:
    shutil.rmtree(Path(data_dir, SNAPSHOTS, snapshot_id), ignore_errors=True)


def seeding_dir(data_dir: str) -> Path:
    """An empty place for the copy's files."""
    d = Path(data_dir, SEEDING)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def install(data_dir: str) -> None:
    """The copy in .seeding/ becomes the store; the store's own files go to .damaged/ (replacing the
    previous ones there). Ends by removing the marker."""
    root, seeding, damaged = Path(data_dir), Path(data_dir, SEEDING), Path(data_dir, DAMAGED)
    shutil.rmtree(damaged, ignore_errors=True)
    damaged.mkdir()
    for f in root.iterdir():
        if f.name not in _OURS:
            os.replace(f, damaged / f.name)
    for f in seeding.iterdir():
        os.replace(f, root / f.name)
    seeding.rmdir()
    _sync_dir(data_dir)
    Path(data_dir, RESEED).unlink(missing_ok=True)
    _sync_dir(data_dir)


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
