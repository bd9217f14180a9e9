"""Two questions about one RocksDB write as the broker makes it (a WriteBatch, sync off, as under
ASYNC flush), asked of rocksdict on this host:

1. Does a write let another Python thread run? A thread counts in a loop while the main thread
   writes prepared batches; its count per second is compared with its count alone. Near 100 %:
   the GIL is released and a write could overlap the loop's decoding on a second core; near 50 %
   (the interpreter's switch interval sharing one GIL): it is held.
2. Does `allow_mmap_writes` take the WAL's write() off a write's cost? Per-write wall, CPU and
   system time, interleaved with and without it.

    .venv/bin/python bench/experiments/rocksdb_write_gil.py
"""

from __future__ import annotations

import resource
import tempfile
import threading
import time

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

BODY = b"x" * 1100  # a 1 KB message's record, about
PENDING = b"y" * 60  # and its pending entry


def _open(mmap_writes: bool = False) -> Rdict:
    o = Options(raw_mode=True)
    o.create_if_missing(True)
    if mmap_writes:
        o.set_allow_mmap_writes(True)
    return Rdict(tempfile.mkdtemp(prefix="rocksdb-write-"), options=o)


def _count(stop: threading.Event, out: list[int]) -> None:
    n = 0
    while not stop.is_set():
        n += 1
    out.append(n)


def _alone(seconds: float) -> int:
    """The counting thread's progress in `seconds` with the main thread asleep."""
    stop, out = threading.Event(), []
    t = threading.Thread(target=_count, args=(stop, out))
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join()
    return out[0]


def gil_share() -> float:
    """Another thread's progress during writes, as a share of its progress alone."""
    db = _open()
    batches = []
    for i in range(300):
        wb = WriteBatch(raw_mode=True)
        for j in range(2000):
            wb.put(b"k%d-%d" % (i, j), BODY[:200])
        batches.append(wb)
    alone = _alone(1.0)
    stop, during = threading.Event(), []
    t = threading.Thread(target=_count, args=(stop, during))
    t.start()
    t0 = time.perf_counter()
    wo = WriteOptions()
    for wb in batches:
        db.write(wb, wo)
    elapsed = time.perf_counter() - t0
    stop.set()
    t.join()
    db.close()
    return (during[0] / elapsed) / alone


def write_cost(mmap_writes: bool, n: int = 40_000) -> tuple[float, float, float]:
    """Microseconds of wall, CPU and system time per single-message write."""
    db = _open(mmap_writes)
    wo = WriteOptions()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for i in range(n):
        wb = WriteBatch(raw_mode=True)
        wb.put(i.to_bytes(8, "big"), BODY)
        wb.put(b"p" + i.to_bytes(8, "big"), PENDING)
        db.write(wb, wo)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    db.close()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return wall / n * 1e6, cpu / n * 1e6, (r1.ru_stime - r0.ru_stime) / n * 1e6


def main() -> None:
    print(f"another thread's progress during writes: {100 * gil_share():.0f} % of its progress alone")
    for mmap_writes in (False, True, False, True):
        wall, cpu, sys_ = write_cost(mmap_writes)
        print(f"allow_mmap_writes={mmap_writes!s:5}  per write: {wall:.2f} us wall, {cpu:.2f} CPU, {sys_:.2f} system")


if __name__ == "__main__":
    main()
