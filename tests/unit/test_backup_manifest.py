"""A backup's manifest and the restore's checks (store/backup.py, store/restore.py), on plain files:
what is refused, with what words, and that a refused restore writes nothing."""

from __future__ import annotations

import json
import os

import pytest

from txbroker.store import backup, restore
from txbroker.store.backup import BackupError, Manifest
from txbroker.store.records import READABLE_FORMATS, STORE_FORMAT_VERSION


def make_backup(path, files: dict[str, bytes], **fields) -> Manifest:
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    m = Manifest(id="s-1", created_ms=1, group="g0", broker="s", master="m:1", epoch=2, epochs=[(1, 1), (2, 9)],
                 last_lsn=40, published_lsn=40, log_start_lsn=1, version="0.2.0", store_format=STORE_FORMAT_VERSION,
                 pending_transactions=1, parked_transactions=0, jobs=0, files=backup.describe_files(path))
    for k, v in fields.items():
        setattr(m, k, v)
    backup.write_manifest(path, m)
    return m


FILES = {"000009.sst": b"table" * 100, "CURRENT": b"MANIFEST-000005\n", "MANIFEST-000005": b"manifest"}


def test_a_manifest_round_trips_and_lists_every_file_with_its_checksum(tmp_path):
    m = make_backup(tmp_path / "b", FILES)
    got = backup.read_manifest(tmp_path / "b")
    assert got == m and [f.name for f in got.files] == sorted(FILES)
    assert {f.name: f.size for f in got.files} == {n: len(d) for n, d in FILES.items()}
    backup.verify(tmp_path / "b", got)
    assert not (tmp_path / "b" / "backup.json.tmp").exists()


@pytest.mark.parametrize("damage, words", [
    ("flip", "does not match its checksum"),
    ("truncate", "has 499 bytes, the manifest says 500"),
    ("delete", "is missing"),
])
def test_a_damaged_or_missing_file_is_named(tmp_path, damage, words):
    m = make_backup(tmp_path / "b", FILES)
    victim = tmp_path / "b" / "000009.sst"
    raw = victim.read_bytes()
    if damage == "flip":
        victim.write_bytes(raw[:10] + bytes([raw[10] ^ 1]) + raw[11:])
    elif damage == "truncate":
        victim.write_bytes(raw[:-1])
    else:
        victim.unlink()
    with pytest.raises(BackupError, match=words) as e:
        backup.verify(tmp_path / "b", m)
    assert "000009.sst" in str(e.value)


def test_what_is_not_a_whole_backup_is_refused_before_reading_on(tmp_path):
    with pytest.raises(BackupError, match="no such directory"):
        backup.read_manifest(tmp_path / "nowhere")
    (tmp_path / "unfinished").mkdir()
    with pytest.raises(BackupError, match="has no backup.json: not a backup, or an unfinished one"):
        backup.read_manifest(tmp_path / "unfinished")
    make_backup(tmp_path / "b", FILES)
    doc = json.loads((tmp_path / "b" / "backup.json").read_text())
    for change, words in (({"kind": "something"}, "not a txbroker backup"),
                          ({"manifest_version": 2}, "manifest version 2"),
                          ({"last_lsn": "forty"}, "malformed"),
                          ({"files": [{"name": "../../etc/passwd", "size": 1, "sha256": "x"}]}, "plain name")):
        (tmp_path / "b" / "backup.json").write_text(json.dumps({**doc, **change}))
        with pytest.raises(BackupError, match=words):
            backup.read_manifest(tmp_path / "b")
    (tmp_path / "b" / "backup.json").write_text("{not json")
    with pytest.raises(BackupError, match="not valid JSON"):
        backup.read_manifest(tmp_path / "b")


def test_a_newer_store_format_is_a_refused_downgrade(tmp_path):
    newer = max(READABLE_FORMATS) + 1
    m = make_backup(tmp_path / "b", FILES, store_format=newer, version="9.0.0")
    with pytest.raises(BackupError) as e:
        restore.restore(tmp_path / "b", tmp_path / "data")
    assert f"store format {newer} (written by txbroker 9.0.0)" in str(e.value) and "downgrade" in str(e.value)
    assert not (tmp_path / "data").exists()
    backup.check_readable(tmp_path / "b", Manifest(**{**_fields(m), "store_format": min(READABLE_FORMATS)}))


def _fields(m: Manifest) -> dict:
    return {f: getattr(m, f) for f in m.__struct_fields__}


def test_a_restore_copies_every_file_and_marks_the_directory(tmp_path):
    m = make_backup(tmp_path / "b", FILES)
    data = tmp_path / "data"
    got, done = restore.restore(tmp_path / "b", data)
    assert done and got.id == m.id
    assert sorted(os.listdir(data)) == sorted([*FILES, "RESTORED"])
    assert all((data / n).read_bytes() == d for n, d in FILES.items())
    assert restore.restored_from(data) == "s-1"
    # again: refused, naming what is there; with if_not_restored, nothing to do
    with pytest.raises(BackupError, match=r"is not empty \(restored from backup s-1\)"):
        restore.restore(tmp_path / "b", data)
    assert restore.restore(tmp_path / "b", data, if_not_restored=True) == (got, False)


def test_a_data_directory_with_anything_in_it_is_refused_and_left_alone(tmp_path):
    make_backup(tmp_path / "b", FILES)
    data = tmp_path / "data"
    data.mkdir()
    (data / "LOCK").write_text("")
    (data / "lost+found").mkdir()   # a new volume's: not data
    with pytest.raises(BackupError, match="data directory .* is not empty: it holds LOCK;"):
        restore.restore(tmp_path / "b", data, if_not_restored=True)
    assert sorted(os.listdir(data)) == ["LOCK", "lost+found"]
    (data / "LOCK").unlink()
    restore.restore(tmp_path / "b", data)   # lost+found alone is empty enough


def test_an_unfinished_restore_of_the_same_backup_is_taken_up_and_of_another_refused(tmp_path):
    m = make_backup(tmp_path / "b", FILES)
    data = tmp_path / "data"
    # killed after moving one file into place
    (data / restore.RESTORING).mkdir(parents=True)
    (data / restore.RESTORING / restore.BACKUP_ID).write_text(m.id + "\n")
    (data / "CURRENT").write_bytes(FILES["CURRENT"])
    (data / restore.RESTORING / "000009.sst").write_bytes(b"half")
    restore.restore(tmp_path / "b", data)
    assert sorted(os.listdir(data)) == sorted([*FILES, "RESTORED"])
    assert all((data / n).read_bytes() == d for n, d in FILES.items())

    other = tmp_path / "other-data"
    (other / restore.RESTORING).mkdir(parents=True)
    (other / restore.RESTORING / restore.BACKUP_ID).write_text("another-backup\n")
    with pytest.raises(BackupError, match=r"is not empty: it holds \.restoring"):
        restore.restore(tmp_path / "b", other)
