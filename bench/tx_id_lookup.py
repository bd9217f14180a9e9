#!/usr/bin/env python3
"""What a half message's "is this transaction id new?" costs: a lookup that misses in the store's
`tx` family (finished transactions), with and without the memtable's bloom filter
(store/db.py, MEMTABLE_BLOOM_RATIO).

    .venv/bin/python bench/tx_id_lookup.py [--entries 300000] [--lookups 100000] [--rounds 2]

A real store (open_database, in a temporary directory) takes `entries` finished transactions under
random ids (150-byte values, in batches of 1,000, as ENDs write them; left in the memtable, as
between two flushes), then `lookups` ids it never saw are looked up through the store's Column.get,
as TransactionService.prepare does for every half message. Rounds alternate the two settings.
Prints the CPU per lookup. Figures only.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "broker_image"))

from rocksdict import WriteBatch  # noqa: E402

from txbroker.store import db as store_db  # noqa: E402


def one(ratio: float, entries: int, lookups: int) -> float:
    store_db.MEMTABLE_BLOOM_RATIO = ratio  # read by _cf_options as the store opens
    path = tempfile.mkdtemp(prefix="txbroker-lookup-")
    database = store_db.open_database(path)
    try:
        handle = database.handles["tx"]
        value = b"x" * 150
        for _ in range(entries // 1000):
            wb = WriteBatch(raw_mode=True)
            for _ in range(1000):
                wb.put(uuid.uuid4().hex.encode(), value, handle)
            database.db.write(wb)
        misses = [uuid.uuid4().hex.encode() for _ in range(lookups)]
        get = database.tx.get
        t0 = time.process_time()
        for k in misses:
            if get(k) is not None:
                raise SystemExit("a random id was found")
        return (time.process_time() - t0) * 1e6 / lookups
    finally:
        database.close()
        shutil.rmtree(path, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=300_000)
    ap.add_argument("--lookups", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    kept = store_db.MEMTABLE_BLOOM_RATIO
    for _ in range(args.rounds):
        for ratio in (0.0, kept):
            us = one(ratio, args.entries, args.lookups)
            label = "no memtable bloom filter" if not ratio else f"memtable bloom filter ({ratio:g} of the memtable)"
            print(f"{label}: {us:.2f} us of CPU per lookup that misses ({args.entries:,} ids in the memtable)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
