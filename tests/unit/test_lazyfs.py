"""chaos/lazyfs.py, the power-loss filesystem: what an application sees before a power loss (every
write, fsynced or not) and after it (exactly what was fsynced), through a real FUSE mount."""

from __future__ import annotations

import ctypes.util
import errno
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos.lazyfs import PAGE, LazyFS, is_mounted  # noqa: E402


def _why_no_fuse() -> str:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None or ctypes.util.find_library("fuse3") is None:
        return "libfuse3 and fusermount3 are missing (Debian's fuse3: bash chaos/setup.sh installs it)"
    if importlib.util.find_spec("mfusepy") is None:
        return "mfusepy is not installed (the test extra: pip install -c constraints.txt -e '.[test]')"
    return ""


pytestmark = pytest.mark.skipif(bool(_why_no_fuse()), reason=_why_no_fuse() or "-")


@pytest.fixture(scope="module")
def fs(tmp_path_factory):
    """One mount for the module's tests (each test works in its own directory)."""
    base = tmp_path_factory.mktemp("lazyfs")
    (base / "backing").mkdir()
    (base / "mnt").mkdir()
    lazy = LazyFS(base / "backing", base / "mnt").start()
    yield lazy
    assert lazy.stop() == 0, lazy.log()[-2000:]
    assert not is_mounted(lazy.mount)


@pytest.fixture
def d(fs, request) -> Path:
    """This test's own directory in the mount."""
    path = fs.mount / request.node.name
    path.mkdir()
    return path


def backing(fs, path: Path) -> Path:
    return fs.backing / path.relative_to(fs.mount)


def write(path: Path, data: bytes, *, sync: bool, offset: int | None = None, flags: int = 0) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
    try:
        if offset is None:
            os.lseek(fd, 0, os.SEEK_END)
            os.write(fd, data)
        else:
            os.pwrite(fd, data, offset)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync(path: Path, datasync: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        (os.fdatasync if datasync else os.fsync)(fd)
    finally:
        os.close(fd)


def test_reads_see_unsynced_writes_and_a_power_loss_keeps_only_what_was_fsynced(fs, d):
    f = d / "wal"
    write(f, b"synced-1|", sync=True)
    write(f, b"pending|", sync=False)
    assert f.read_bytes() == b"synced-1|pending|"
    assert f.stat().st_size == len(b"synced-1|pending|")
    assert backing(fs, f).read_bytes() == b"synced-1|", "an unsynced write reached the backing file"

    answer = fs.power_loss()
    assert answer["paths"].get(f"/{d.name}/wal") == len(b"pending|"), answer
    assert f.read_bytes() == b"synced-1|"
    assert f.stat().st_size == len(b"synced-1|")


def test_appends_across_sync_points_and_page_boundaries(fs, d):
    f = d / "log"
    a, b, c, e = (bytes([65 + i]) * n for i, n in enumerate((PAGE - 100, 3 * PAGE + 7, 5000, 123)))
    write(f, a, sync=True)
    write(f, b, sync=False)
    write(f, c, sync=True)  # makes b durable too: fsync covers the whole file
    write(f, e, sync=False)
    write(f, b"overwritten", sync=False, offset=10)  # an unsynced overwrite of synced bytes
    assert f.read_bytes() == a[:10] + b"overwritten" + a[21:] + b + c + e
    fs.power_loss()
    assert f.read_bytes() == a + b + c


def test_fdatasync_makes_data_durable_like_fsync(fs, d):
    f = d / "data"
    write(f, b"x" * 10000, sync=False)
    fsync(f, datasync=True)
    write(f, b"y" * 10, sync=False)
    fs.power_loss()
    assert f.read_bytes() == b"x" * 10000


def test_a_file_created_and_never_fsynced_survives_empty(fs, d):
    f = d / "000042.sst"
    write(f, b"table data", sync=False)
    fs.power_loss()
    assert f.exists(), "creating a file is metadata: kept"
    assert f.read_bytes() == b""


def test_fsync_through_another_handle_or_after_close_still_counts(fs, d):
    """Pending data belongs to the file, not to the handle that wrote it."""
    f = d / "MANIFEST"
    write(f, b"edit-1;", sync=False)  # written and closed: still pending
    fsync(f)  # a new read-only handle's fsync makes it durable
    write(f, b"edit-2;", sync=False)
    fs.power_loss()
    assert f.read_bytes() == b"edit-1;"


def test_rename_of_a_synced_file_survives_and_current_can_be_replaced(fs, d):
    """RocksDB's CURRENT: write a temp file, fsync it, rename it over CURRENT, fsync the directory."""
    current = d / "CURRENT"
    write(current, b"MANIFEST-000001\n", sync=True)
    tmp = d / "000002.dbtmp"
    write(tmp, b"MANIFEST-000005\n", sync=True)
    tmp.rename(current)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)  # a directory fsync: accepted
    finally:
        os.close(dfd)
    fs.power_loss()
    assert current.read_bytes() == b"MANIFEST-000005\n"
    assert not tmp.exists()
    assert backing(fs, current).read_bytes() == b"MANIFEST-000005\n"


def test_rename_before_fsync_keeps_the_new_name_with_only_the_fsynced_data(fs, d):
    """The classic hazard: the rename is kept, the data written before it (never fsynced) is not."""
    config = d / "config"
    write(config, b"old", sync=True)
    tmp = d / "config.tmp"
    write(tmp, b"new contents", sync=False)
    tmp.rename(config)
    assert config.read_bytes() == b"new contents"
    fs.power_loss()
    assert config.exists() and not tmp.exists()
    assert config.read_bytes() == b"", "the renamed file's data was never fsynced"


def test_pending_data_follows_its_file_across_a_rename(fs, d):
    f = d / "a"
    write(f, b"durable;", sync=True)
    write(f, b"written-before-rename;", sync=False)
    f.rename(d / "b")
    fsync(d / "b")
    fs.power_loss()
    assert (d / "b").read_bytes() == b"durable;written-before-rename;"


def test_truncate_is_pending_until_fsync(fs, d):
    f = d / "t"
    data = bytes(range(256)) * 40  # 10240 bytes, nothing zero-filled by accident past 4096
    write(f, data, sync=True)
    os.truncate(f, 100)
    assert f.stat().st_size == 100
    assert f.read_bytes() == data[:100]
    fs.power_loss()
    assert f.read_bytes() == data, "an unsynced truncate was kept"

    # Shrink, then grow again by writing past the end: the gap reads as zeros, never as the bytes
    # the truncate cut off, before the fsync and after it.
    fd = os.open(f, os.O_RDWR)
    try:
        os.ftruncate(fd, 100)
        os.pwrite(fd, b"tail", 6000)
        want = data[:100] + bytes(6000 - 100) + b"tail"
        assert os.pread(fd, 10000, 0) == want
        os.fsync(fd)
    finally:
        os.close(fd)
    fs.power_loss()
    assert f.read_bytes() == want
    assert backing(fs, f).read_bytes() == want


def test_o_trunc_is_pending_until_fsync(fs, d):
    f = d / "rewritten"
    write(f, b"first version", sync=True)
    write(f, b"second", sync=False, flags=os.O_TRUNC)
    assert f.read_bytes() == b"second"
    fs.power_loss()
    assert f.read_bytes() == b"first version"


def test_an_open_handle_sees_the_fsynced_length_after_a_power_loss(fs, d):
    """No attribute cache keeps answering the length a power loss took back (attr_timeout=0)."""
    f = d / "grown"
    write(f, b"kept", sync=True)
    fd = os.open(f, os.O_RDWR)
    try:
        os.pwrite(fd, b"-dropped" * 1000, 4)
        assert os.fstat(fd).st_size == 4 + 8000
        fs.power_loss()
        assert os.fstat(fd).st_size == 4  # asked before any read (a short read updates it too)
        assert os.stat(f).st_size == 4
        assert os.pread(fd, 100, 0) == b"kept"
    finally:
        os.close(fd)


def test_an_unsynced_overwrite_is_not_served_from_a_kernel_cache_after_a_power_loss(fs, d):
    """Same length, same mtime after the power loss: only direct_io keeps the kernel's page cache
    from serving the dropped bytes to a handle that stayed open."""
    f = d / "overwritten"
    kept = b"kept" * 2048
    write(f, kept, sync=True)
    fd = os.open(f, os.O_RDWR)
    try:
        os.pwrite(fd, b"DROP" * 1024, 0)
        assert os.pread(fd, 8, 0) == b"DROPDROP"
        fs.power_loss()
        assert os.pread(fd, len(kept), 0) == kept
    finally:
        os.close(fd)


def test_posix_fallocate_is_pending_and_other_modes_are_refused(fs, d):
    f = d / "prealloc"
    write(f, b"abc", sync=True)
    fd = os.open(f, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, 3 * PAGE)
        assert os.fstat(fd).st_size == 3 * PAGE
        assert os.pread(fd, 3 * PAGE, 0) == b"abc" + bytes(3 * PAGE - 3)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        keep_size = 0x01
        assert libc.fallocate(fd, keep_size, 0, 10 * PAGE) == -1
        assert ctypes.get_errno() == errno.EOPNOTSUPP
    finally:
        os.close(fd)
    fs.power_loss()
    assert f.read_bytes() == b"abc"


def test_unlink_removes_the_file_and_its_pending_data_at_once(fs, d):
    f = d / "old.log"
    write(f, b"synced", sync=True)
    write(f, b"pending", sync=False)
    fd = os.open(f, os.O_RDONLY)
    try:
        f.unlink()
        assert not backing(fs, f).exists(), "unlink is metadata: applied to the backing at once"
        assert os.pread(fd, 100, 0) == b"syncedpending", "an unlinked open file is still readable"
    finally:
        os.close(fd)
    write(f, b"new", sync=False)  # a new file under the old name starts empty
    fs.power_loss()
    assert f.read_bytes() == b""


def test_sync_all_makes_every_pending_write_durable_on_sigusr2(fs, d):
    for name in ("one", "two"):
        write(d / name, name.encode() * 3, sync=False)
    answer = fs.sync_all(by_signal=True)
    assert answer["done"] == "sync" and answer["files"] >= 2
    assert backing(fs, d / "one").read_bytes() == b"oneoneone"
    fs.power_loss()
    assert (d / "two").read_bytes() == b"twotwotwo"


def test_sigusr1_is_a_power_loss(fs, d):
    f = d / "sig"
    write(f, b"durable", sync=True)
    write(f, b"+volatile", sync=False)
    answer = fs.power_loss(by_signal=True)
    assert answer["done"] == "crash" and answer["bytes"] >= len(b"+volatile")
    assert f.read_bytes() == b"durable"


def test_lazyfs_over_its_own_backing_directory_and_a_clean_unmount_on_sigterm(tmp_path):
    """How the harness uses it: mounted over a broker's data directory itself. SIGTERM unmounts
    cleanly, keeping what was written (an unmount syncs)."""
    data = tmp_path / "b0"
    data.mkdir()
    (data / "before").write_bytes(b"there before the mount")
    lazy = LazyFS(data, data, control=tmp_path / "control", log_path=tmp_path / "lazyfs.log").start()
    try:
        assert (data / "before").read_bytes() == b"there before the mount"
        write(data / "synced", b"s", sync=True)
        write(data / "unsynced", b"u", sync=False)
        write(data / "lost", b"l", sync=False)
        lazy.power_loss()
        write(data / "unsynced", b"u", sync=False)
    finally:
        assert lazy.stop() == 0, lazy.log()[-2000:]
    assert not is_mounted(data)
    assert (data / "synced").read_bytes() == b"s"
    assert (data / "lost").read_bytes() == b""
    assert (data / "unsynced").read_bytes() == b"u", "a clean unmount syncs what is pending"
    assert "unmounted" in lazy.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs as the backing (root)")
def test_unsynced_writes_count_against_free_space_so_a_full_disk_fails_the_write(tmp_path):
    back, mnt = tmp_path / "small", tmp_path / "mnt"
    back.mkdir()
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "lazyfs-test", str(back)], check=True)
    lazy = None
    try:
        lazy = LazyFS(back, mnt, control=tmp_path / "control", log_path=tmp_path / "lazyfs.log").start()
        free_before = os.statvfs(mnt).f_bavail
        write(mnt / "half", b"h" * (512 * 1024), sync=False)
        assert os.statvfs(mnt).f_bavail < free_before - 100, "pending data is not shown as used"
        with pytest.raises(OSError) as e:
            write(mnt / "more", b"m" * (768 * 1024), sync=False)
        assert e.value.errno == errno.ENOSPC
        lazy.power_loss()
        write(mnt / "again", b"a" * (768 * 1024), sync=True)  # the dropped data's space is free again
        assert (back / "again").stat().st_size == 768 * 1024
    finally:
        if lazy is not None:
            lazy.stop()
        subprocess.run(["umount", "-l", str(back)], check=False)
