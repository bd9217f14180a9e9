"""The RocksDB WriteBatch limit on this host: how many 1 KiB messages a second RocksDB alone takes
in batches of 100, with the broker's own database options (store/db.py), one writing thread, as
the broker's event loop writes. Issue 33 sets 100-message transactions against 0.8 of this.

    .venv/bin/python bench/rocksdb_limit.py                 # both flush modes, 5 s each, prints a table
    .venv/bin/python bench/rocksdb_limit.py --seconds 10 --json bench/results/rocksdb-limit.json

Two shapes per flush mode: 100 separate puts of 1 KiB (each message its own key, as a store that
indexes every message would write) and one put of the 100 messages as one value (the shape of
txbroker's half record, one log record per transaction). SYNC writes each batch with fsync, as a
SYNC-flush broker does; ASYNC leaves the write-ahead log to the OS."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "broker_image"))

from rocksdict import WriteBatch, WriteOptions  # noqa: E402

from txbroker.store.db import open_database  # noqa: E402

BATCH = 100
SIZE = 1024


def measure(path: str, sync: bool, one_value: bool, seconds: float) -> dict:
    shutil.rmtree(path, ignore_errors=True)
    db = open_database(path)
    try:
        wo = WriteOptions()
        wo.sync = sync
        handle = db.handles["log"]
        bodies = [os.urandom(SIZE) for _ in range(BATCH)]
        joined = b"".join(bodies)
        key, batches = 0, 0
        start = time.perf_counter()
        cpu0 = time.process_time()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            wb = WriteBatch(raw_mode=True)
            if one_value:
                wb.put(key.to_bytes(8, "big"), joined, handle)
                key += 1
            else:
                for body in bodies:
                    wb.put(key.to_bytes(8, "big"), body, handle)
                    key += 1
            db.db.write(wb, wo)
            batches += 1
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu0
    finally:
        db.close()
    msgs = batches * BATCH
    return {"flush": "SYNC" if sync else "ASYNC", "shape": "1 value of 100 messages" if one_value else "100 puts",
            "batches": batches, "msgs_per_s": round(msgs / elapsed), "batches_per_s": round(batches / elapsed),
            "cpu_us_per_msg": round(cpu * 1e6 / msgs, 2), "seconds": round(elapsed, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per case (default %(default)s)")
    ap.add_argument("--dir", help="where to write the database (default: a new temporary directory)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    base = args.dir or tempfile.mkdtemp(prefix="rocksdb-limit-")
    rows = []
    try:
        for sync in (False, True):
            for one_value in (False, True):
                rows.append(measure(os.path.join(base, "db"), sync, one_value, args.seconds))
                r = rows[-1]
                print(f"{r['flush']:5} {r['shape']:24} {r['msgs_per_s']:>10,} msgs/s  {r['batches_per_s']:>8,} "
                      f"batches/s  {r['cpu_us_per_msg']:>6} us CPU/msg", flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"batch": BATCH, "size": SIZE, "rows": rows,
                                               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
