"""Seeding a slave from its master: a consistent copy of the master's store, fetched file by file
over the replication connection (REPLICATION_SNAPSHOT), when the slave cannot go on from its own:

- its store is damaged (a checksum fails at open or at a read: StoreCorrupt; never served);
- it needs records its master's retention deleted (the master refuses its subscription);
- an operator asked for it (`txbroker broker --reseed`, or a RESEED marker in the data directory).

The slave marks its data directory (store/seed.py), stops, and at its next start, before opening
the store, fetches the copy; the kubelet's restart (or the fault harness's) is that next start. The
copy holds the master's log up to one instant; the slave then replicates the rest as any slave.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time

from txbroker.broker.replies import Reply, RequestError, ok
from txbroker.client.connection import Connection
from txbroker.client.security import Credentials, authenticate
from txbroker.protocol.bodies import ErrorBody, SnapshotRequest, SnapshotResponse, decoder, encode
from txbroker.protocol.codes import RequestCode, ResponseCode, code_name
from txbroker.store import seed
from txbroker.store.db import StoreCorrupt, verify_store

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # bytes per read: one frame well under the frame limit
IDLE_S = 600  # a copy nobody read for this long is dropped


class SnapshotService:
    """The master's side: copies begun, read, ended (or dropped when left idle)."""

    def __init__(self, broker):
        self._b = broker
        self._open: dict[str, tuple[dict[str, int], float]] = {}  # id -> ({file: size}, last used)

    def handle(self, req: SnapshotRequest) -> Reply:
        self._expire()
        if req.action == "begin":
            return self._begin()
        files = self._files(req.snapshot_id)
        if req.action == "read":
            return self._read(req, files)
        if req.action == "end":
            self._open.pop(req.snapshot_id, None)
            seed.drop_snapshot(self._b.config.data_dir, req.snapshot_id)
            return ok(SnapshotResponse(req.snapshot_id))
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"snapshot action {req.action[:20]!r}: begin, read or end")

    def _begin(self) -> Reply:
        state = self._b.state
        snapshot_id = f"{int(time.time())}-{secrets.token_hex(4)}"
        last_lsn = state.local_durable_lsn
        target = state.checkpoint(snapshot_id)
        files = dict(seed.snapshot_files(target))
        self._open[snapshot_id] = (files, time.monotonic())
        log.info("snapshot %s of the store for a slave's seed: %d files, %d bytes, through LSN %d or later",
                 snapshot_id, len(files), sum(files.values()), last_lsn)
        return ok(SnapshotResponse(snapshot_id, sorted(files.items()), b"", last_lsn))

    def _files(self, snapshot_id: str) -> dict[str, int]:
        got = self._open.get(snapshot_id)
        if got is None:
            raise RequestError(ResponseCode.QUERY_NOT_FOUND, f"no snapshot {snapshot_id[:40]!r} on this broker "
                                                             "(ended, or dropped after being idle)")
        self._open[snapshot_id] = (got[0], time.monotonic())
        return got[0]

    def _read(self, req: SnapshotRequest, files: dict[str, int]) -> Reply:
        size = files.get(req.name)
        if size is None:  # only the copy's own files: a name is never a path
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"snapshot {req.snapshot_id} has no file {req.name[:60]!r}")
        if not 0 <= req.offset <= size or not 0 < req.length <= CHUNK:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"read {req.name} at {req.offset}+{req.length}: the file has "
                                                             f"{size} bytes, a read at most {CHUNK}")
        path = os.path.join(self._b.config.data_dir, seed.SNAPSHOTS, req.snapshot_id, req.name)
        with open(path, "rb") as f:
            f.seek(req.offset)
            return ok(SnapshotResponse(req.snapshot_id, data=f.read(req.length)))

    def _expire(self) -> None:
        now = time.monotonic()
        for snapshot_id in [s for s, (_f, used) in self._open.items() if now - used > IDLE_S]:
            del self._open[snapshot_id]
            seed.drop_snapshot(self._b.config.data_dir, snapshot_id)
            log.warning("snapshot %s dropped: idle for %d s (its slave gave up?)", snapshot_id, IDLE_S)


async def seed_from_master(config, credentials: tuple[str, str] | None, tls, why: str) -> None:
    """Make the data directory a copy of the master's store (the slave's start, before opening it)."""
    data_dir = config.data_dir
    seed.mark(data_dir, why)
    log.warning("seeding the store from master %s: %s", config.master, why)
    t0 = time.monotonic()
    conn = Connection(config.master, ssl_context=tls, server_hostname=config.tls_server_name or None)
    await conn.open(10.0)
    try:
        if credentials is not None:
            await authenticate(conn, Credentials(*credentials), 10.0)
        begun = await _call(conn, SnapshotRequest("begin"))
        target = seed.seeding_dir(data_dir)
        total = 0
        for name, size in begun.files:
            with open(target / name, "wb") as f:
                offset = 0
                while offset < size:
                    r = await _call(conn, SnapshotRequest("read", begun.snapshot_id, name, offset, min(CHUNK, size - offset)))
                    if not r.data:
                        raise OSError(f"snapshot {begun.snapshot_id}: {name} ended at {offset} of {size} bytes")
                    f.write(r.data)
                    offset += len(r.data)
                f.flush()
                os.fsync(f.fileno())
            total += size
        await _call(conn, SnapshotRequest("end", begun.snapshot_id))
    finally:
        conn.close()
    try:  # read back before it is used: the master's cache may have hidden a damaged block (seed 571)
        verify_store(str(target))
    except StoreCorrupt as e:
        raise OSError(f"the copy of master {config.master}'s store is damaged, so it was not installed (the master's "
                      f"own files are: fail it over, and it is seeded in turn): {e}") from e
    seed.install(data_dir)
    log.warning("store seeded from master %s in %.1fs: %d files, %d bytes, through LSN %d or later; replicating "
                "the rest from there", config.master, time.monotonic() - t0, len(begun.files), total, begun.last_lsn)


async def _call(conn: Connection, req: SnapshotRequest) -> SnapshotResponse:
    frame = await conn.call(RequestCode.REPLICATION_SNAPSHOT, encode(req), 60.0)
    if frame.code != ResponseCode.SUCCESS:
        remark = decoder(ErrorBody).decode(frame.body).remark
        raise OSError(f"master refused the snapshot's {req.action}: {code_name(frame.code)}: {remark}")
    return decoder(SnapshotResponse).decode(frame.body)


def run_seed(config, credentials, tls, why: str) -> None:
    asyncio.run(seed_from_master(config, credentials, tls, why))
