"""A LazyFS-style filesystem for the "power loss" nemesis: writes an application did not fsync are
lost when the power fails (Jepsen's LazyFS, here as a FUSE filesystem in Python on libfuse3).

    python -m chaos.lazyfs --backing DIR --mount DIR [--control FILE]

Files live in --backing; --mount shows them (the two may be the same directory: the backing is
opened before the mount covers it, and every operation works relative to that handle, so the
harness can mount lazyfs over a broker's tmpfs data directory).

What survives a power loss (the semantics, exactly)
---------------------------------------------------
* A file's contents and its length are one unit of durability. Every change to them -- write,
  truncate/ftruncate (also O_TRUNC), fallocate -- is kept in memory (an emulated page cache, per
  file, in 4 KiB pages) and answered from there: reads, fstat/stat sizes and later writes see it at
  once. fsync or fdatasync of the file (through any handle) writes that file's pending pages and
  length to the backing file and fsyncs it. After a power loss every file holds exactly the bytes
  and the length it had at its last fsync; a file never fsynced since it was created is empty.
  Closing a file syncs nothing (close is not fsync); pending data outlives the handle. Times and
  the other attributes are the backing file's: st_mtime moves when data reaches it (at fsync).
* The namespace is metadata, applied to the backing directory at once and kept by a power loss, as
  a journaling filesystem commits it and as LazyFS does: create, mkdir, rmdir, unlink, rename, link,
  symlink, chmod, chown, utimens. So a file created and never fsynced survives, empty; a file
  renamed before its data was fsynced survives under the new name with only its fsynced data (the
  ext4 "zero-length file after rename" hazard). A file's pending data follows its inode across
  renames: fsync under the new name makes it durable there.
* fsync of a directory (RocksDB's after creating or renaming a file) fsyncs the backing directory;
  since metadata is already applied it is only a barrier here: it neither adds nor drops anything.
* fallocate: mode 0 (posix_fallocate) is a pending length change like truncate (zeros to the new
  end), charged against the backing's free space; every other mode (KEEP_SIZE, PUNCH_HOLE, ...)
  answers EOPNOTSUPP, and RocksDB goes on without preallocation.
* Space: data pending in memory is charged against the backing filesystem's free space when a
  write or truncate grows a file, so a full disk answers ENOSPC at write time (as a page cache's
  delayed allocation reserves blocks), and statfs reports free space less what is pending. A fsync
  that still meets ENOSPC on the backing fails with it, and the data stays pending.
* No mmap: files are served with direct_io, so the kernel keeps no page cache of them that could
  go on serving data a power loss dropped (mmap is refused; RocksDB reads with pread unless
  allow_mmap_reads, which txbroker does not set). Attributes are not cached either
  (attr_timeout=0), so a size a power loss took back is seen by the next stat. Locks (fcntl,
  flock: RocksDB's LOCK file) are the kernel's own, kept per mount.

Faults and commands
-------------------
* SIGUSR1, or the line ``crash`` written to the control file: power loss. Every pending write,
  truncate and fallocate of every file is dropped; open handles stay usable and see the fsynced
  contents. Nothing is lost that was fsynced.
* SIGUSR2, or ``sync``: sync all (every file's pending data made durable), handy in tests.
* SIGTERM or SIGINT: a clean shutdown: everything pending is synced (as an unmount would), then the
  filesystem is unmounted and the process exits 0.
After each command the control file (if given) is replaced by one JSON line saying it is done:
``{"seq": 3, "done": "crash", "files": 2, "bytes": 8192, "paths": {"/store/000012.log": 8000, ...}}``
(the files that had pending data, and the bytes written to them since their last sync, dropped or
synced); the same goes to stderr. Commands are applied one at a time, in order.

The harness's order for a power loss: kill -9 the broker, wait for it to be gone (its write and
fsync calls in flight are answered before the process can exit, so none lands afterwards), then
the power loss (wait for its "done"), then start the broker again on the same mount. `LazyFS`
below does the process handling for tests and the harness, e.g. over cluster.py's tmpfs:

    lazy = LazyFS(data, data, control=workdir / "b0.lazyfs", log_path=workdir / "b0.lazyfs.log").start()
    broker.signal(signal.SIGKILL)  # Popen.wait()s for it
    lazy.power_loss()              # returns lazyfs's answer once everything unsynced is gone
    ...                            # restart the broker on `data`; at the end: lazy.stop(), then umount
                                   # the tmpfs

Keep the control file outside the mount. A full disk (cluster.py's fill_disk) works through the
mount: its posix_fallocate is charged at once and the writes after it meet ENOSPC.

Hot path: one lock, a dict of dirty pages per file; a write copies into pages, fsync writes the
runs of dirty pages with one pwrite each. Reads of a file with nothing pending are one pread. The
cost is mostly FUSE's round trips: with SYNC flush a group commit is one write and one fdatasync
request (35-45 us of lazyfs CPU per acknowledged operation, measured on 2 cores).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

PAGE = 4096
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
COMMANDS = {"crash": "crash", "lazyfs::crash": "crash", "sync": "sync", "lazyfs::sync": "sync"}


def _load_mfusepy():
    """mfusepy bound to libfuse3 (it prefers libfuse 2 when both are installed; we need libfuse3's
    truncate with a file handle and its config)."""
    if not os.environ.get("FUSE_LIBRARY_PATH"):
        os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    import mfusepy  # noqa: PLC0415 - a test may only want the helper class below

    if mfusepy.fuse_version_major != 3:
        raise RuntimeError(f"lazyfs needs libfuse 3 (Debian's fuse3), found {mfusepy.fuse_version_major}")
    return mfusepy


class File:
    """One backing inode as the emulated page cache holds it."""

    __slots__ = ("key", "name", "fd", "writable", "handles", "pages", "size", "bsize", "floor", "charge", "dirty")

    def __init__(self, key, fd: int, writable: bool):
        self.key = key
        self.name = ""  # its path in the mount when last opened or renamed (for the reports)
        self.fd = fd  # the backing file, open while a handle is or anything is pending
        self.writable = writable
        self.handles = 0
        self.pages: dict[int, bytearray] = {}  # page number -> the page as written (dirty pages only)
        self.size: int | None = None  # the length the application sees; None: nothing pending
        self.bsize = 0  # the backing file's length when this file became dirty
        self.floor = 0  # the lowest length since then: backing bytes from here on are gone
        self.charge = 0  # bytes of growth charged against the backing's free space
        self.dirty = 0  # bytes written since the last sync (reported when dropped or synced)

    @property
    def pending(self) -> bool:
        return self.size is not None


class LazyOps:
    """The filesystem's operations (mfusepy's Operations protocol), on a backing directory fd."""

    use_ns = True

    def __init__(self, backing_fd: int):
        self.root = backing_fd
        self.mutex = threading.Lock()
        self.files: dict[tuple[int, int], File] = {}  # (st_dev, st_ino) of the backing file
        self.handles: dict[int, File] = {}
        self.next_fh = 1
        self.charged = 0  # all files' charges
        self._free = 0  # the backing's free bytes at the last look
        self._free_at = 0.0

    # ---- paths and files ------------------------------------------------------------------------

    @staticmethod
    def _rel(path: str | None) -> str:
        if path is None:
            raise OSError(errno.ENOENT, "no path (an unlinked file)")
        return path.lstrip("/") or "."

    def _file_of_fd(self, fd: int, writable: bool) -> File:
        """The File for a freshly opened backing fd (taking it, or closing it for the known one)."""
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        f = self.files.get(key)
        if f is None:
            f = self.files[key] = File(key, fd, writable)
        elif writable and not f.writable:
            os.close(f.fd)
            f.fd, f.writable = fd, True
        else:
            os.close(fd)
        return f

    def _open_backing(self, rel: str, flags: int = 0, mode: int = 0o644) -> tuple[int, bool]:
        base = os.O_CLOEXEC | (flags & (os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW))
        try:
            return os.open(rel, base | os.O_RDWR, mode, dir_fd=self.root), True
        except (PermissionError, IsADirectoryError) as e:
            if flags & os.O_ACCMODE != os.O_RDONLY and not isinstance(e, IsADirectoryError):
                raise
            return os.open(rel, base | os.O_RDONLY, mode, dir_fd=self.root), False

    def _forget_if_idle(self, f: File) -> None:
        if f.handles == 0 and not f.pending and self.files.get(f.key) is f:
            del self.files[f.key]
            os.close(f.fd)

    def _forget_if_gone(self, key) -> None:
        """After an unlink or a rename over it: a file with no name and no handle is dropped with
        whatever it had pending (nobody can fsync it any more)."""
        f = self.files.get(key)
        if f is not None and f.handles == 0 and os.fstat(f.fd).st_nlink == 0:
            self._clean(f)
            self._forget_if_idle(f)

    def _key_at(self, rel: str):
        try:
            st = os.stat(rel, dir_fd=self.root, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None

    # ---- the page cache -------------------------------------------------------------------------

    def _make_dirty(self, f: File) -> None:
        if f.size is None:
            f.bsize = f.floor = f.size = os.fstat(f.fd).st_size

    def _clean(self, f: File) -> int:
        """Forget f's pending state (after a sync, or dropped); returns the bytes it had written."""
        dirty = f.dirty
        f.pages = {}
        f.size = None
        f.dirty = 0
        self.charged -= f.charge
        f.charge = 0
        return dirty

    def _resize(self, f: File, size: int) -> None:
        """The application's length becomes `size`; growth past the backing is charged to space."""
        charge = max(0, size - f.bsize)
        grow = charge - f.charge
        if grow > 0:
            now = time.monotonic()
            if self.charged + grow > self._free or now - self._free_at > 1.0:
                sv = os.fstatvfs(self.root)
                self._free, self._free_at = sv.f_bavail * sv.f_frsize, now
                if self.charged + grow > self._free:
                    raise OSError(errno.ENOSPC, "no space left (counting data not yet synced)")
        self.charged += grow
        f.charge = charge
        if size < f.size:
            last, cut = divmod(size, PAGE)
            for pno in [p for p in f.pages if p > last or (p == last and cut == 0)]:
                del f.pages[pno]
            page = f.pages.get(last)
            if page is not None and cut:
                page[cut:] = bytes(PAGE - cut)
            if size < f.floor:
                f.floor = size
        f.size = size

    def _page(self, f: File, pno: int) -> bytearray:
        page = bytearray(PAGE)
        valid = f.floor - pno * PAGE  # backing bytes still part of the file in this page
        if valid > 0:
            chunk = os.pread(f.fd, min(valid, PAGE), pno * PAGE)
            page[:len(chunk)] = chunk
        f.pages[pno] = page
        return page

    def _write(self, f: File, data: bytes, offset: int) -> int:
        self._make_dirty(f)
        n = len(data)
        end = offset + n
        if end > f.size:
            self._resize(f, end)
        pages = f.pages
        view = memoryview(data)
        pos = 0
        while pos < n:
            pno, po = divmod(offset + pos, PAGE)
            k = min(PAGE - po, n - pos)
            page = pages.get(pno)
            if page is None:
                page = self._page(f, pno)
            page[po:po + k] = view[pos:pos + k]
            pos += k
        f.dirty += n
        return n

    def _read(self, f: File, size: int, offset: int) -> bytes:
        if f.size is None:
            return os.pread(f.fd, size, offset)
        end = min(offset + size, f.size)
        parts = []
        pages = f.pages
        o = offset
        while o < end:
            pno, po = divmod(o, PAGE)
            page = pages.get(pno)
            if page is not None:
                k = min(PAGE - po, end - o)
                parts.append(bytes(page[po:po + k]))
                o += k
                continue
            stop = (pno + 1) * PAGE  # a run of clean pages: one pread, zeros past the floor
            while stop < end and stop // PAGE not in pages:
                stop += PAGE
            stop = min(stop, end)
            valid = min(stop, f.floor) - o
            chunk = os.pread(f.fd, valid, o) if valid > 0 else b""
            parts.append(chunk)
            if len(chunk) < stop - o:
                parts.append(bytes(stop - o - len(chunk)))
            o = stop
        return b"".join(parts)

    def _sync(self, f: File, datasync: bool = False) -> int:
        """Write f's pending pages and length to the backing file and fsync it."""
        if f.size is None:
            (os.fdatasync if datasync else os.fsync)(f.fd)
            return 0
        if not f.writable:
            raise OSError(errno.EBADF, "pending data on a file opened read-only")
        fd, size = f.fd, f.size
        if f.floor < f.bsize:
            os.ftruncate(fd, f.floor)
        pnos = sorted(f.pages)
        i = 0
        while i < len(pnos):
            j = i + 1
            while j < len(pnos) and pnos[j] == pnos[j - 1] + 1:
                j += 1
            start = pnos[i] * PAGE
            stop = min((pnos[j - 1] + 1) * PAGE, size)
            if stop > start:
                buf = memoryview(b"".join(f.pages[p] for p in pnos[i:j]))[:stop - start]
                while buf:
                    done = os.pwrite(fd, buf, start)
                    buf, start = buf[done:], start + done
            i = j
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
        (os.fdatasync if datasync else os.fsync)(fd)
        self._free -= f.charge  # now on the backing: its free space went down as the charge goes
        return self._clean(f)

    # ---- commands (the lock held by the caller) -------------------------------------------------

    def power_loss(self) -> dict:
        paths = {}
        for f in list(self.files.values()):
            if f.pending:
                paths[f.name] = paths.get(f.name, 0) + self._clean(f)
                self._forget_if_idle(f)
        return {"done": "crash", "files": len(paths), "bytes": sum(paths.values()), "paths": _top(paths)}

    def sync_all(self) -> dict:
        paths = {}
        for f in list(self.files.values()):
            if f.pending:
                paths[f.name] = paths.get(f.name, 0) + self._sync(f)
                self._forget_if_idle(f)
        return {"done": "sync", "files": len(paths), "bytes": sum(paths.values()), "paths": _top(paths)}

    # ---- FUSE operations ------------------------------------------------------------------------

    def init_with_config(self, conn, config) -> None:
        if config is not None:
            config.direct_io = 1  # no kernel page cache: nothing dropped can be served from it
            config.kernel_cache = 0
            config.auto_cache = 0
            config.attr_timeout = 0.0  # sizes change at a power loss
            config.negative_timeout = 0.0
            config.entry_timeout = 1.0  # names never change at a power loss
            config.hard_remove = 1  # unlink while open: no .fuse_hidden files in the backing
            config.nullpath_ok = 1  # ...and operations on such files come by handle

    def getattr(self, path, fh=None):
        with self.mutex:
            if fh:
                st = os.fstat(self.handles[fh].fd)
            else:
                st = os.stat(self._rel(path), dir_fd=self.root, follow_symlinks=False)
            size, blocks = st.st_size, st.st_blocks
            f = self.files.get((st.st_dev, st.st_ino)) if stat.S_ISREG(st.st_mode) else None
            if f is not None and f.size is not None:
                size = f.size
                blocks = max(blocks, (size + 511) // 512)
        return {"st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_uid": st.st_uid, "st_gid": st.st_gid,
                "st_size": size, "st_blocks": blocks, "st_blksize": st.st_blksize, "st_rdev": st.st_rdev,
                "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def _new_handle(self, f: File, flags: int) -> int:
        if flags & os.O_TRUNC:
            self._make_dirty(f)
            self._resize(f, 0)
        f.handles += 1
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = f
        return fh

    def open(self, path, flags):
        with self.mutex:
            fd, writable = self._open_backing(self._rel(path), flags)
            f = self._file_of_fd(fd, writable)
            f.name = path
            return self._new_handle(f, flags)

    def create(self, path, mode, flags=os.O_WRONLY):
        with self.mutex:
            fd, writable = self._open_backing(self._rel(path), flags | os.O_CREAT, mode)
            f = self._file_of_fd(fd, writable)
            f.name = path
            return self._new_handle(f, flags)

    def read(self, path, size, offset, fh):
        with self.mutex:
            return self._read(self.handles[fh], size, offset)

    def write(self, path, data, offset, fh):
        with self.mutex:
            return self._write(self.handles[fh], data, offset)

    def truncate(self, path, length, fh=None):
        with self.mutex:
            if fh:
                f = self.handles[fh]
            else:
                fd, writable = self._open_backing(self._rel(path), os.O_WRONLY)
                f = self._file_of_fd(fd, writable)
            try:
                if f.size is None and os.fstat(f.fd).st_size == length:
                    return 0  # nothing changes (RocksDB's ftruncate to the length it wrote)
                self._make_dirty(f)
                self._resize(f, length)
            finally:
                self._forget_if_idle(f)
        return 0

    def fallocate(self, path, mode, offset, size, fh):
        if mode != 0:
            raise OSError(errno.EOPNOTSUPP, "only posix_fallocate's mode 0")
        with self.mutex:
            f = self.handles[fh]
            self._make_dirty(f)
            if offset + size > f.size:
                self._resize(f, offset + size)
        return 0

    def fsync(self, path, datasync, fh):
        with self.mutex:
            self._sync(self.handles[fh], bool(datasync))
        return 0

    def release(self, path, fh):
        with self.mutex:
            f = self.handles.pop(fh)
            f.handles -= 1
            if f.handles == 0 and f.pending and os.fstat(f.fd).st_nlink == 0:
                self._clean(f)  # unlinked and closed: nobody can read or fsync it any more
            self._forget_if_idle(f)
        return 0

    # Directories: the handle is the backing directory's fd (operations on a handle get no path).
    def opendir(self, path):
        return os.open(self._rel(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.root)

    def releasedir(self, path, fh):
        os.close(fh)
        return 0

    def fsyncdir(self, path, datasync, fh):
        os.fsync(fh)  # metadata is on the backing already: a barrier, nothing pending to write
        return 0

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(fh)]

    def statfs(self, path):
        sv = os.fstatvfs(self.root)
        with self.mutex:
            held = -(-self.charged // sv.f_frsize)
        return {"f_bsize": sv.f_bsize, "f_frsize": sv.f_frsize, "f_blocks": sv.f_blocks,
                "f_bfree": max(0, sv.f_bfree - held), "f_bavail": max(0, sv.f_bavail - held),
                "f_files": sv.f_files, "f_ffree": sv.f_ffree, "f_favail": sv.f_favail,
                "f_namemax": sv.f_namemax}

    def access(self, path, amode):
        if not os.access(self._rel(path), amode, dir_fd=self.root, follow_symlinks=False):
            raise OSError(errno.EACCES, "access")
        return 0

    def mkdir(self, path, mode):
        os.mkdir(self._rel(path), mode, dir_fd=self.root)
        return 0

    def rmdir(self, path):
        os.rmdir(self._rel(path), dir_fd=self.root)
        return 0

    def unlink(self, path):
        rel = self._rel(path)
        with self.mutex:
            key = self._key_at(rel)
            os.unlink(rel, dir_fd=self.root)
            if key is not None:
                self._forget_if_gone(key)
        return 0

    def rename(self, old, new):
        src, dst = self._rel(old), self._rel(new)
        with self.mutex:
            moved, replaced = self._key_at(src), self._key_at(dst)
            os.rename(src, dst, src_dir_fd=self.root, dst_dir_fd=self.root)
            if replaced is not None and replaced != moved:
                self._forget_if_gone(replaced)
            if moved in self.files:
                self.files[moved].name = new
        return 0

    def link(self, target, source):
        os.link(self._rel(source), self._rel(target), src_dir_fd=self.root, dst_dir_fd=self.root,
                follow_symlinks=False)
        return 0

    def symlink(self, target, source):
        os.symlink(source, self._rel(target), dir_fd=self.root)
        return 0

    def readlink(self, path):
        return os.readlink(self._rel(path), dir_fd=self.root)

    def chmod(self, path, mode):
        os.chmod(self._rel(path), mode, dir_fd=self.root)
        return 0

    def chown(self, path, uid, gid):
        os.chown(self._rel(path), uid, gid, dir_fd=self.root, follow_symlinks=False)
        return 0

    def utimens(self, path, times=None):
        if times is None:
            os.utime(self._rel(path), dir_fd=self.root, follow_symlinks=False)
        else:
            os.utime(self._rel(path), ns=tuple(int(t) for t in times), dir_fd=self.root, follow_symlinks=False)
        return 0

    def destroy(self, path) -> None:
        """Unmounted: a clean shutdown keeps what was written, as an unmount syncs."""
        with self.mutex:
            try:
                result = self.sync_all()
                _say(f"unmounting: synced {result['bytes']} pending bytes in {result['files']} files")
            finally:
                for f in self.files.values():
                    os.close(f.fd)
                self.files.clear()
                self.handles.clear()


def _top(paths: dict[str, int], n: int = 50) -> dict[str, int]:
    """The files with the most bytes (pending bytes written since their last sync), at most n."""
    return dict(sorted(paths.items(), key=lambda kv: -kv[1])[:n])


def _say(msg: str) -> None:
    sys.stderr.write(f"lazyfs: {msg}\n")
    sys.stderr.flush()


class Commands:
    """Power loss and sync all, from signals or the control file, one at a time; each answered in
    the control file (one JSON line) and on stderr."""

    def __init__(self, ops: LazyOps, control: Path | None):
        self.ops = ops
        self.control = control
        self.seq = 0
        self.order = threading.Lock()

    def run(self, command: str) -> dict:
        with self.order:
            with self.ops.mutex:
                t0 = time.perf_counter()
                try:
                    result = self.ops.power_loss() if command == "crash" else self.ops.sync_all()
                except OSError as e:
                    result = {"done": command, "error": str(e)}
                result["ms"] = round((time.perf_counter() - t0) * 1000, 3)
            self.seq += 1
            result = {"seq": self.seq, **result}
            _say(("power loss" if command == "crash" else "sync all") + ": " + json.dumps(result))
            self._answer(result)
            return result

    def _answer(self, result: dict) -> None:
        if self.control is None:
            return
        tmp = self.control.with_name(self.control.name + ".tmp")
        tmp.write_text(json.dumps(result) + "\n")
        os.replace(tmp, self.control)

    def signals(self) -> None:
        while True:
            sig = signal.sigwait({signal.SIGUSR1, signal.SIGUSR2})
            self.run("crash" if sig == signal.SIGUSR1 else "sync")

    def watch(self) -> None:
        """Polls the control file (a line `crash` or `sync`, newline-terminated) every 10 ms."""
        while True:
            time.sleep(0.01)
            try:
                text = self.control.read_text()
            except OSError:
                continue
            if not text.endswith("\n") or text.startswith("{"):
                continue
            word = text.strip()
            if word in COMMANDS:
                self.run(COMMANDS[word])
            else:
                with self.order:
                    self.seq += 1
                    self._answer({"seq": self.seq, "error": f"unknown command {word!r}: crash or sync"})


def serve(backing: Path, mount: Path, control: Path | None, debug: bool = False) -> int:
    mfusepy = _load_mfusepy()

    class _FUSE(mfusepy.FUSE):
        # mfusepy drops libfuse3's file handle from truncate (ftruncate needs it) and the flags from
        # rename (RENAME_NOREPLACE/EXCHANGE must not turn into a plain rename).
        def truncate_fuse_3(self, path, length, fip):
            fh = fip.contents.fh if fip else None
            return self.operations.truncate(None if path is None else path.decode(), length, fh)

        def rename_fuse_3(self, old, new, flags):
            if flags:
                return -errno.EINVAL
            return self.operations.rename(old.decode(), new.decode())

        def utimens_fuse_3(self, path, buf, fip):
            # UTIME_NOW and UTIME_OMIT (touch, utimensat) come as tv_nsec markers mfusepy would
            # fold into nonsense times.
            times = None
            if buf:
                st = os.stat(ops._rel(path.decode()), dir_fd=ops.root, follow_symlinks=False)
                now = time.time_ns()
                given = ((buf.contents.actime, st.st_atime_ns), (buf.contents.modtime, st.st_mtime_ns))
                times = tuple(now if ts.tv_nsec == UTIME_NOW else old if ts.tv_nsec == UTIME_OMIT
                              else ts.tv_sec * 10**9 + ts.tv_nsec for ts, old in given)
            return self.operations.utimens(path.decode(), times)

    # SIGUSR1/2 go to one thread waiting for them: blocked before any thread starts, so every thread
    # (libfuse's too) inherits the block. The stop signals go to the main thread only, where libfuse's
    # handler ends its loop (libfuse blocks them in its own workers; ours block them too).
    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2, *stops})
    backing_fd = os.open(backing, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    ops = LazyOps(backing_fd)
    commands = Commands(ops, control)
    if control is not None:
        control.write_text("")
        threading.Thread(target=commands.watch, name="lazyfs-control", daemon=True).start()
    threading.Thread(target=commands.signals, name="lazyfs-signals", daemon=True).start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    _say(f"mounting {backing} at {mount} (pid {os.getpid()})")
    try:
        _FUSE(ops, str(mount), foreground=True, debug=debug, fsname="lazyfs", subtype="lazyfs",
              default_permissions=True)
    except RuntimeError as e:
        # libfuse's loop ends with the stop signal's number as its error, which fuse_main turns into
        # 8: after SIGTERM/SIGINT that is the clean way out (destroy has run and synced).
        if str(e) != "8":
            raise
    finally:
        if is_mounted(mount):  # the loop died without unmounting: leave no dead mount behind
            subprocess.run(["fusermount3", "-u", "-z", str(mount)], check=False, capture_output=True)
    _say("unmounted")
    return 0


def is_mounted(mount: Path) -> bool:
    """A lazyfs filesystem is mounted at `mount` (the topmost mount there)."""
    want = os.path.realpath(mount)
    found = False
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
            if point == want:
                found = fields[fields.index("-") + 1] == "fuse.lazyfs"
    return found


class LazyFS:
    """A lazyfs process for tests and the harness: start (returns once mounted), power_loss and
    sync_all (return once done, with lazyfs's answer), stop (clean unmount)."""

    def __init__(self, backing: Path, mount: Path, control: Path | None = None, log_path: Path | None = None):
        self.backing, self.mount = Path(backing), Path(mount)
        self.control = Path(control) if control else self.mount.parent / f".{self.mount.name}.lazyfs-control"
        self.log_path = Path(log_path) if log_path else self.mount.parent / f".{self.mount.name}.lazyfs.log"
        self.proc: subprocess.Popen | None = None
        self.seq = 0

    def start(self, timeout: float = 15.0) -> "LazyFS":
        root = Path(__file__).resolve().parents[1]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chaos.lazyfs", "--backing", str(self.backing), "--mount", str(self.mount),
                 "--control", str(self.control)], cwd=root, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not is_mounted(self.mount):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"lazyfs did not mount {self.mount}: {self.log()[-2000:]}")
            time.sleep(0.02)
        self.seq = 0
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _wait_done(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                text = self.control.read_text()
                if text.startswith("{"):
                    answer = json.loads(text)
                    if answer["seq"] > self.seq:
                        self.seq = answer["seq"]
                        if "error" in answer:
                            raise RuntimeError(f"lazyfs: {answer['error']}")
                        return answer
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"lazyfs did not answer: {self.log()[-2000:]}")
            time.sleep(0.005)

    def command(self, word: str, by_signal: bool = False, timeout: float = 30.0) -> dict:
        if by_signal:
            self.proc.send_signal(signal.SIGUSR1 if word == "crash" else signal.SIGUSR2)
        else:
            tmp = self.control.with_name(self.control.name + ".cmd")
            tmp.write_text(word + "\n")
            os.replace(tmp, self.control)
        return self._wait_done(timeout)

    def power_loss(self, by_signal: bool = False) -> dict:
        """Drop every write not fsynced; returns {"files": ..., "bytes": ...} dropped."""
        return self.command("crash", by_signal)

    def sync_all(self, by_signal: bool = False) -> dict:
        return self.command("sync", by_signal)

    def stop(self, timeout: float = 15.0) -> int | None:
        rc = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        elif self.proc is not None:
            rc = self.proc.returncode
        if is_mounted(self.mount):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], check=False, capture_output=True)
        return rc

    def __enter__(self) -> "LazyFS":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.lazyfs", description=__doc__.split("\n\n")[0])
    p.add_argument("--backing", required=True, type=Path, help="the directory the files live in")
    p.add_argument("--mount", required=True, type=Path, help="where to mount (may be --backing itself)")
    p.add_argument("--control", type=Path, help="a file to write `crash` or `sync` into; answered there")
    p.add_argument("--debug", action="store_true", help="libfuse's debug output")
    a = p.parse_args(argv)
    return serve(a.backing.resolve(), a.mount.resolve(), a.control.resolve() if a.control else None, a.debug)


if __name__ == "__main__":
    sys.exit(main())
