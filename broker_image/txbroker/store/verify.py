"""`python -m txbroker.store.verify DIR`: every block of the store in DIR read once, with its
checksum (db.verify_store), in a process of its own. A broker checks a copy of its store this way
(a backup): in a thread of its own process the reading holds the interpreter's lock and the
broker's loop would answer requests many times slower meanwhile. Exit 0: whole (the keys read on
stdout); 3: damaged (where, on stderr)."""

from __future__ import annotations

import asyncio
import sys

from txbroker.store.db import StoreCorrupt, verify_store

EXIT_DAMAGED = 3


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m txbroker.store.verify DATA_DIR", file=sys.stderr)
        return 2
    try:
        n = verify_store(args[0])
    except StoreCorrupt as e:
        print(e, file=sys.stderr)
        return EXIT_DAMAGED
    print(n)
    return 0


async def verify_elsewhere(path: str) -> int:
    """verify_store(path) in a process of its own; raises StoreCorrupt as it would."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "txbroker.store.verify", path,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await proc.communicate()
    except BaseException:  # cancelled (the broker stopping): the check goes with it
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    said = err.decode(errors="replace").strip()
    if proc.returncode == EXIT_DAMAGED:
        raise StoreCorrupt(said)
    if proc.returncode != 0:
        raise RuntimeError(f"checking the store at {path} failed (exit {proc.returncode}): {said[-500:]}")
    return int(out)


if __name__ == "__main__":
    sys.exit(main())
