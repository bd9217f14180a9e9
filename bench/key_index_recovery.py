#!/usr/bin/env python3
"""What a crash with keys still to be written costs the next start: a store's recovery time with
its key index written whole, and with every key of its last commits lost with the process (the
key index is written behind the log: store/derived/key_index.py).

    .venv/bin/python bench/key_index_recovery.py [--commits 1000] [--messages 1000]

A real store (RocksDB in a temporary directory, ASYNC flush) takes `commits` transactions of
`messages` keyed messages of 100 bytes each, committed; then either every key is written and the
store dropped (`whole`), or it is dropped with them all waiting (`behind`: what kill -9 leaves).
Prints the time to open the store again and how many keyed messages it queued to index. Figures
only."""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "broker_image"))

from txbroker.protocol.bodies import Message  # noqa: E402
from txbroker.protocol.codes import TransactionState  # noqa: E402
from txbroker.store.derived import key_index  # noqa: E402
from txbroker.store.records import EndRecord, HalfRecord  # noqa: E402
from txbroker.store.state import StateMachine  # noqa: E402


async def written(s: StateMachine) -> None:
    pending = s.barrier()  # (None: all of it written and published already)
    if pending is not None:
        await pending


async def fill(path: str, commits: int, messages: int, whole: bool) -> None:
    key_index.IDLE_S = 3600.0  # nothing written behind unless asked,
    key_index.MAX_BACKLOG = commits * messages + 1  # up to the broker's own bound (MAX_BACKLOG messages)
    s = StateMachine(path, False, lambda e: None)
    body = b"x" * 100
    for c in range(commits):
        half, _f = s.append(HalfRecord(f"tx{c}", "g", 1, [
            Message("T", body, keys=f"k{c}-{i}", queue_id=i % 4) for i in range(messages)]))
        p = s.pending_transaction(f"tx{c}")
        s.append_to_queues(p.runs, lambda offsets: EndRecord(p.transaction_id, half, TransactionState.COMMIT, 2,
                                                             offsets))
        if c % 50 == 49:
            await written(s)
    await written(s)
    if whole:
        s.key_index.catch_up()
    # dropped, as a killed process leaves it (a column family's handle holds RocksDB's LOCK)
    s.key_index.close()
    s.db.close()
    for family in s.families:
        family.__dict__.clear()
    s.__dict__.clear()
    gc.collect()


def reopen(path: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    s = StateMachine(path, False, lambda e: None)
    seconds = time.perf_counter() - t0
    waiting = s.key_index.backlog_messages()
    asyncio.run(s.close())
    return seconds, waiting


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=1000, help="keyed messages per commit")
    args = ap.parse_args()
    for case in ("whole", "behind"):
        work = tempfile.mkdtemp(prefix="txbroker-key-recovery-")
        try:
            asyncio.run(fill(work, args.commits, args.messages, case == "whole"))
            seconds, waiting = reopen(work)
            print(f"{case}: {args.commits:,} commits of {args.messages:,} keyed messages; the store opened in "
                  f"{seconds:.2f} s with {waiting:,} keyed messages queued to index")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
