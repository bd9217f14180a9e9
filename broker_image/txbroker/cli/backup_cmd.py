"""`txbroker backup create|restore|verify`: a consistent copy of a broker group's store, and a new
broker's store made from one (docs/backup.md)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from txbroker.cli.security_opts import add_arguments, client_options
from txbroker.client.admin import AdminClient
from txbroker.client.errors import ClientError
from txbroker.store.backup import (
    BackupError, check_readable, read_manifest, sha256_of, sync_dir, verify, write_manifest,
)
from txbroker.store.restore import IGNORED, restore

PARTIAL = ".partial"  # in the target: the files as they arrive, moved up once all are checked


def register(sub, default_admin: str) -> None:
    p = sub.add_parser("backup", help="back up a broker group from a slave in sync; restore into a new broker",
                       description="Back up a broker group: a consistent copy (a RocksDB checkpoint) of the store of "
                                   "one of its slaves in sync with its master, with a manifest (backup.json: group, "
                                   "broker, epoch, log position, store format, each file's size and checksum); and "
                                   "restore one into the empty data directory of a new broker, which then holds "
                                   "everything the group held at that log position: messages, pending and parked "
                                   "transactions, jobs, consumer offsets, group settings, retention's state.")
    bsub = p.add_subparsers(dest="backup_command", required=True, metavar="ACTION")
    c = bsub.add_parser("create", help="copy a slave's store into a new directory",
                        description="Ask the broker at --admin, a slave in sync with its master, for a consistent "
                                    "copy of its store and write it into --to, an empty or new directory: the files "
                                    "first (each checked against the manifest as it arrives), backup.json last, so "
                                    "a directory without backup.json is an unfinished backup. A master refuses, "
                                    "naming its slaves in sync; so does a slave not in sync (disconnected, its master "
                                    "silent, or behind what its master published).")
    c.add_argument("--admin", default=default_admin, help="admin URL of a slave of the group (default %(default)s)")
    c.add_argument("--to", required=True, help="directory to write the backup into: new, or empty")
    c.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for the broker's copy and each file (default %(default)s)")
    add_arguments(c)
    c.set_defaults(run=create)
    r = bsub.add_parser("restore", help="make a new broker's data directory from a backup",
                        description="Check a backup (its manifest, its store format against the formats this "
                                    "txbroker reads, each file's size and checksum) and copy it into --data-dir, "
                                    "which must be empty or absent: nothing is written unless every check passes, "
                                    "and an existing store is never replaced. Then start a broker on --data-dir: it "
                                    "opens the group's store as it was at the backup's log position, as a master "
                                    "(or as it is told), and checks back the pending transactions.")
    r.add_argument("--from", dest="source", required=True, help="the backup's directory (holding backup.json)")
    r.add_argument("--data-dir", required=True, help="the new broker's data directory: empty or absent")
    r.add_argument("--if-not-restored", action="store_true",
                   help="succeed without doing anything if --data-dir was restored from this same backup already "
                        "(an init container that runs at every start of its pod); any other content is still refused")
    r.set_defaults(run=restore_cmd)
    v = bsub.add_parser("verify", help="check a backup without restoring it",
                        description="Check a backup as restore does (manifest, store format, every file's size and "
                                    "checksum) and say what it holds; changes nothing.")
    v.add_argument("--from", dest="source", required=True, help="the backup's directory (holding backup.json)")
    v.set_defaults(run=verify_cmd)


def _occupants(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n not in IGNORED) if path.exists() else []


def create(args) -> int:
    to = Path(args.to)
    if to.exists() and not to.is_dir():
        raise BackupError(f"backup target {to} is a file, not a directory")
    taken = _occupants(to)
    if taken:
        raise BackupError(f"backup target {to} is not empty: it holds {', '.join(taken[:8])}; a backup goes into a new "
                          "or empty directory (nothing was written)")
    admin = AdminClient(args.admin, timeout=args.timeout, **client_options(args))
    manifest = admin.create_backup()
    created = not to.exists()
    partial = to / PARTIAL
    try:
        partial.mkdir(parents=True, exist_ok=True)
        for f in manifest.files:
            with open(partial / f.name, "wb") as out:
                admin.fetch_backup_file(manifest.id, f.name, out)
                out.flush()
                os.fsync(out.fileno())
            if (partial / f.name).stat().st_size != f.size or sha256_of(partial / f.name) != f.sha256:
                raise BackupError(f"backup {manifest.id}: {f.name} arrived unlike its manifest (size or checksum); "
                                  "nothing kept, try again")
        sync_dir(partial)
        for f in manifest.files:
            os.replace(partial / f.name, to / f.name)
        partial.rmdir()
        write_manifest(to, manifest)  # last: present means whole
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        for f in manifest.files:
            (to / f.name).unlink(missing_ok=True)
        if created and to.exists() and not os.listdir(to):
            to.rmdir()
        raise
    finally:
        try:
            admin.drop_backup(manifest.id)
        except ClientError as e:  # it goes by itself once idle
            print(f"txbroker backup: the broker's copy {manifest.id} was not dropped ({e}); it goes when idle")
    print(f"backup of {manifest.broker} written to {to}: group {manifest.group or '-'}, epoch {manifest.epoch}, log "
          f"through LSN {manifest.last_lsn} (from {manifest.log_start_lsn}), {manifest.pending_transactions} pending and "
          f"{manifest.parked_transactions} parked transactions, {manifest.jobs} jobs, {len(manifest.files)} files, "
          f"{sum(f.size for f in manifest.files)} bytes, store format {manifest.store_format}; id {manifest.id}")
    return 0


def restore_cmd(args) -> int:
    manifest, done = restore(Path(args.source), Path(args.data_dir), args.if_not_restored)
    if not done:
        print(f"{args.data_dir}: already restored from backup {manifest.id}; nothing to do")
        return 0
    print(f"restored backup {manifest.id} (group {manifest.group or '-'}, taken from {manifest.broker} at epoch "
          f"{manifest.epoch}, log through LSN {manifest.last_lsn}) into {args.data_dir}: "
          f"{manifest.pending_transactions} pending and {manifest.parked_transactions} parked transactions, "
          f"{manifest.jobs} jobs; start a broker on it")
    return 0


def verify_cmd(args) -> int:
    source = Path(args.source)
    manifest = read_manifest(source)
    check_readable(source, manifest)
    verify(source, manifest)
    print(f"backup {manifest.id} at {source} is whole: {len(manifest.files)} files match their checksums; group "
          f"{manifest.group or '-'}, broker {manifest.broker}, epoch {manifest.epoch}, log through LSN "
          f"{manifest.last_lsn}, store format {manifest.store_format} (txbroker {manifest.version})")
    return 0
