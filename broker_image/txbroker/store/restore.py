"""Restoring a backup (store/backup.py) into a data directory, for a new broker to open.

Nothing is written until the backup has passed every check (manifest, store format, each file's
size and checksum), and only into a data directory that holds no store: a restore never replaces
data. The files are copied into `<data dir>/.restoring/` (checked again as they are written), then
moved into place, and a marker, `RESTORED`, naming the backup is written last. A restore killed
half way leaves `.restoring/` and the files it moved, all of that backup: a second run of the same
backup takes up from there; anything else in the directory is refused, named.

The marker lets an init container that runs at every start of its pod (the operator's, on
Kubernetes) restore once: `--if-not-restored` accepts a directory restored from the same backup.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from txbroker.store.backup import BackupError, Manifest, check_readable, read_manifest, sha256_of, sync_dir, verify

RESTORED = "RESTORED"
RESTORING = ".restoring"
BACKUP_ID = "BACKUP_ID"  # in .restoring/: which backup the unfinished restore was of
IGNORED = ("lost+found",)  # a fresh filesystem's (a new volume): not data


def restored_from(data_dir: Path) -> str | None:
    """The id of the backup this data directory was restored from, if it was."""
    try:
        return json.loads(Path(data_dir, RESTORED).read_text()).get("backup_id")
    except (FileNotFoundError, ValueError, AttributeError):
        return None


def _unfinished_of(data_dir: Path) -> str | None:
    try:
        return Path(data_dir, RESTORING, BACKUP_ID).read_text().strip()
    except FileNotFoundError:
        return None


def _occupants(data_dir: Path, manifest: Manifest) -> list[str]:
    """What the data directory holds that a restore of `manifest` must not overwrite."""
    if not data_dir.exists():
        return []
    names = sorted(n for n in os.listdir(data_dir) if n not in IGNORED)
    if _unfinished_of(data_dir) == manifest.id:  # our own unfinished run: its files may be there
        ours = {f.name for f in manifest.files} | {RESTORING}
        return [n for n in names if n not in ours]
    return names


def restore(source: Path, data_dir: Path, if_not_restored: bool = False) -> tuple[Manifest, bool]:
    """Copy the backup at `source` into `data_dir`. Returns its manifest, and False when nothing was
    done because `if_not_restored` and the directory was restored from this backup already."""
    source, data_dir = Path(source), Path(data_dir)
    manifest = read_manifest(source)
    check_readable(source, manifest)
    if if_not_restored and restored_from(data_dir) == manifest.id:
        return manifest, False
    occupants = _occupants(data_dir, manifest)
    if occupants:
        shown = ", ".join(occupants[:8]) + (f" and {len(occupants) - 8} more" if len(occupants) > 8 else "")
        earlier = restored_from(data_dir)
        why = f" (restored from backup {earlier})" if earlier else ""
        raise BackupError(f"data directory {data_dir} is not empty{why}: it holds {shown}; a backup is restored only "
                          "into an empty directory, for a new broker (nothing was changed)")
    verify(source, manifest)
    work = data_dir / RESTORING
    if _unfinished_of(data_dir) != manifest.id:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    (work / BACKUP_ID).write_text(manifest.id + "\n")
    for f in manifest.files:
        if Path(data_dir, f.name).exists() and not Path(work, f.name).exists():
            continue  # moved into place by the unfinished run
        _copy(source / f.name, work / f.name)
        if sha256_of(work / f.name) != f.sha256:  # what was written is what was checked
            raise BackupError(f"restoring {f.name} into {data_dir}: the copy does not match its checksum (a failing "
                              f"disk?); {work} holds the unfinished restore")
    sync_dir(work)
    for f in manifest.files:
        if Path(work, f.name).exists():
            os.replace(work / f.name, data_dir / f.name)
    sync_dir(data_dir)
    marker = {"backup_id": manifest.id, "source": str(source), "group": manifest.group, "broker": manifest.broker,
              "last_lsn": manifest.last_lsn, "restored_ms": int(time.time() * 1000)}
    tmp = data_dir / (RESTORED + ".tmp")
    tmp.write_text(json.dumps(marker) + "\n")
    os.replace(tmp, data_dir / RESTORED)
    shutil.rmtree(work)
    sync_dir(data_dir)
    return manifest, True


def _copy(src: Path, dst: Path) -> None:
    with open(src, "rb") as i, open(dst, "wb") as o:
        shutil.copyfileobj(i, o, 1 << 20)
        o.flush()
        os.fsync(o.fileno())
