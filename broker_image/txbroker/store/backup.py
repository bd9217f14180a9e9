"""A backup of a broker group's store: the files of a RocksDB checkpoint of one of its slaves, and a
manifest, `backup.json`, saying where it came from (group, broker, epoch), how far its log goes,
which store format it holds and every file's size and SHA-256.

The manifest is written last (broker/backup.py makes the checkpoint, cli/backup_cmd.py fetches the
files): a directory without it is an unfinished backup, never taken for a whole one. Everything a
restore needs to refuse a backup (a format this broker cannot read, a damaged or missing file) is
checked here before anything is written (store/restore.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec

from txbroker.store.records import READABLE_FORMATS

MANIFEST = "backup.json"
KIND = "txbroker-backup"
MANIFEST_VERSION = 1  # raised when the manifest changes in a way an older restore would misread


class BackupError(ValueError):
    """A backup that cannot be made or restored, with what was wrong (the CLI prints it as is)."""


class BackupFile(msgspec.Struct):
    name: str
    size: int
    sha256: str


class Manifest(msgspec.Struct, kw_only=True):
    id: str
    created_ms: int
    group: str  # the broker group (cluster) the store belongs to
    broker: str  # the slave it was taken from
    master: str  # that slave's master then
    epoch: int  # the epoch of the last record held
    epochs: list[tuple[int, int]]  # (epoch, first LSN) of the log held
    last_lsn: int  # the last log record held: the backup's log position
    published_lsn: int  # what the master had published (acknowledged) as far as the slave knew
    log_start_lsn: int  # retention deleted (most) records before this
    version: str  # the software that wrote it
    store_format: int
    pending_transactions: int
    parked_transactions: int
    jobs: int
    files: list[BackupFile]
    kind: str = KIND
    manifest_version: int = MANIFEST_VERSION


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def describe_files(directory: Path) -> list[BackupFile]:
    """Every file of a checkpoint, with its size and checksum (reads them all: run off the loop)."""
    return [BackupFile(f.name, f.stat().st_size, sha256_of(f))
            for f in sorted(Path(directory).iterdir(), key=lambda f: f.name) if f.is_file()]


def check_name(name: str) -> str:
    """A file of a backup is named, never a path (a manifest is input: it must not reach elsewhere)."""
    if not name or name in (".", "..", MANIFEST) or "/" in name or "\\" in name or name.startswith("."):
        raise BackupError(f"a backup's file name must be a plain name, got {name[:80]!r}")
    return name


def encode(manifest: Manifest) -> bytes:
    return msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n"


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """backup.json, written to a temporary name, synced and renamed: present means whole."""
    tmp = Path(directory, MANIFEST + ".tmp")
    with open(tmp, "wb") as f:
        f.write(encode(manifest))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, Path(directory, MANIFEST))
    sync_dir(directory)


def read_manifest(directory: Path) -> Manifest:
    path = Path(directory, MANIFEST)
    if not Path(directory).is_dir():
        raise BackupError(f"backup {directory}: no such directory")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BackupError(f"backup {directory} has no {MANIFEST}: not a backup, or an unfinished one (its manifest "
                          "is written last)") from None
    try:
        head = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise BackupError(f"backup {directory}: {MANIFEST} is not valid JSON ({e})") from None
    if not isinstance(head, dict) or head.get("kind") != KIND:
        raise BackupError(f"backup {directory}: {MANIFEST} is not a txbroker backup's manifest (kind {KIND!r} expected)")
    if head.get("manifest_version") != MANIFEST_VERSION:
        raise BackupError(f"backup {directory}: manifest version {head.get('manifest_version')!r}, written by txbroker "
                          f"{head.get('version', '?')}; this txbroker reads version {MANIFEST_VERSION}: restore it "
                          "with the version that made it, or a newer one")
    try:
        manifest = msgspec.json.decode(raw, type=Manifest)
    except msgspec.ValidationError as e:
        raise BackupError(f"backup {directory}: {MANIFEST} is malformed: {e}") from None
    for f in manifest.files:
        check_name(f.name)
    return manifest


def check_readable(directory: Path, manifest: Manifest) -> None:
    """A store of a format this broker does not read is refused here, as the broker would refuse it
    at start (docs/upgrading.md): restoring a newer release's backup with an older one is a downgrade."""
    if manifest.store_format not in READABLE_FORMATS:
        from txbroker import __version__
        raise BackupError(
            f"backup {directory} holds store format {manifest.store_format} (written by txbroker {manifest.version}); "
            f"this txbroker {__version__} reads formats {', '.join(map(str, sorted(READABLE_FORMATS)))}: restore it "
            "with a version that reads it (a downgrade cannot take a newer store)")


def verify(directory: Path, manifest: Manifest) -> None:
    """Every file the manifest lists is there, of its size and checksum; the first that is not is named."""
    for f in manifest.files:
        path = Path(directory, f.name)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise BackupError(f"backup {directory}: file {f.name} is missing (the manifest lists {len(manifest.files)} "
                              "files)") from None
        if size != f.size:
            raise BackupError(f"backup {directory}: file {f.name} has {size} bytes, the manifest says {f.size}: "
                              "damaged or cut short")
        if sha256_of(path) != f.sha256:
            raise BackupError(f"backup {directory}: file {f.name} does not match its checksum (sha256) in the "
                              "manifest: the file is damaged")


def sync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
