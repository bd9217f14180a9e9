"""Backups under faults (docs/backup.md), with the real CLI, and the restored copies read back.

  take       `txbroker backup create --admin <a slave's admin URL> --to DIR` while the workload and
             the other faults run. What comes back is one of:
               taken        backup.json written: its manifest (group, epoch, last and published LSN)
               refused      409 NOT_IN_SYNC: the slave was not in sync (not connected, its master
                            silent, behind) or had become the master; 507 NO_SPACE: its disk was full
                            (seed 282: answered 500 before); the broker's words are kept
               unreachable  its admin API did not answer (killed, paused past the timeout, cut off)
               failed       anything else (the checker's `backup failed`: a refusal must say why)
             A backup that did not finish must leave no backup.json (whole or absent).
  restore    at the end: `txbroker backup restore --from DIR --data-dir D`, then a standalone
             `txbroker broker` on it (a master, no route, no slaves, no clients but this reader, on
             free ports of the hub's loopback) with its wall clock set back before the schedule began:
             what it shows is what the backup held, not what it decided after (an open job's
             deadline, a pending transaction's check-back); its topics read with chaos/reader.py, its
             queues' first offsets, its pending and parked transactions and its jobs by the admin API.

The judgement of what a restored copy holds is checker.check_restored.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from txbroker.client import AsyncPullConsumer
from txbroker.client.admin import AdminClient
from txbroker.client.errors import ClientError

from chaos.broker import FAKETIME, TXBROKER
from chaos.checker import DATA_TOPICS
from chaos.reader import Reader

MANIFEST_KEYS = ("id", "group", "broker", "master", "epoch", "last_lsn", "published_lsn", "log_start_lsn",
                 "created_ms", "pending_transactions", "parked_transactions", "jobs")
CREATE_TIMEOUT_S = 10  # each request of the CLI: a slave paused past it is `unreachable`


def classify(code: int, stderr: str) -> tuple[str, str]:
    """(outcome, reason) of a `backup create` that exited with `code`."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    said = lines[-1] if lines else ""
    if code == 0:
        return "taken", ""
    if code == 1 and any(f"({why})" in said for why in ("NOT_IN_SYNC", "NO_SPACE", "STORE_DAMAGED")):
        return "refused", said
    if code == 1 and " unreachable: " in said:
        return "unreachable", said
    return "failed", said or f"exit code {code}, nothing said"


def take(admin_url: str, dest: Path) -> dict:
    """One backup with the real CLI; monotonic `sent` (before the request) and `answered` (after)."""
    sent, sent_wall = time.monotonic(), time.time()
    try:
        r = subprocess.run([TXBROKER, "backup", "create", "--admin", admin_url, "--to", str(dest),
                            "--timeout", str(CREATE_TIMEOUT_S)], capture_output=True, text=True, timeout=120)
        code, stderr = r.returncode, r.stderr
    except subprocess.TimeoutExpired:
        code, stderr = -1, "the CLI did not end within 120 s"
    out = {"sent": sent, "sent_wall": sent_wall, "answered": time.monotonic(), "exit_code": code, "dir": str(dest)}
    out["outcome"], out["reason"] = classify(code, stderr)
    manifest = dest / "backup.json"
    if out["outcome"] == "taken":
        doc = json.loads(manifest.read_text())
        out["manifest"] = {k: doc.get(k) for k in MANIFEST_KEYS}
    elif manifest.exists():
        out["left_whole"] = True  # the checker's `backup failed`: it failed, yet looks like a whole backup
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _where_stuck(address: str, reader: Reader) -> str:
    """The queues a reader could not read to their end: where it stood, and what a pull there says."""
    stuck = []
    async with AsyncPullConsumer([address], request_timeout=3) as c:
        for (group, topic), count in sorted(reader.queues.items()):
            for q in range(count):
                offset = reader.next.get((group, topic, q), 0)
                try:
                    r = await c.pull(topic, q, offset, 64)
                except ClientError as e:
                    stuck.append(f"{topic}:{q} at {offset}: {e}")
                    continue
                if r.max_offset > offset:
                    stuck.append(f"{topic}:{q} at {offset}: pull gave {len(r.messages)} messages, next offset "
                                 f"{r.next_offset}, max offset {r.max_offset}")
    return "; ".join(stuck[:10]) or "no queue behind now"


def restore_and_read(backup_dir: Path, root: Path, name: str, clock_back_s: int, timeout: float = 60) -> dict:
    """Restore a backup into root/<name>, start a standalone broker on it, read what it holds, stop
    it. Returns {"restore": what the CLI said, "error": why it could not be read (else absent),
    "seen": {(topic, queue, offset): body}, "starts": {(topic, queue): first offset},
    "pending": [transaction ids, pending or parked], "jobs": {job id: state}}."""
    data = root / name
    log_path = root.parent / f"{name}.log"  # beside the brokers' logs: kept with a failing schedule's
    r = subprocess.run([TXBROKER, "backup", "restore", "--from", str(backup_dir), "--data-dir", str(data)],
                       capture_output=True, text=True, timeout=120)
    out: dict = {"restore": (r.stdout + r.stderr).strip()[-500:]}
    if r.returncode != 0:
        out["error"] = f"restore exited {r.returncode}: {out['restore']}"
        return out
    port, admin_port = _free_port(), _free_port()
    clock = root / f"{name}.clock"
    clock.write_text(f"{-clock_back_s:+d}\n")
    env = dict(os.environ, LD_PRELOAD=FAKETIME, FAKETIME_TIMESTAMP_FILE=str(clock), FAKETIME_CACHE_DURATION="1",
               DONT_FAKE_MONOTONIC="1")
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen([TXBROKER, "broker", "--data-dir", str(data), "--broker-name", name,
                                 "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
                                 "--log-level", "INFO"], stdout=logf, stderr=subprocess.STDOUT, env=env)
    try:
        admin = AdminClient(f"http://127.0.0.1:{admin_port}", timeout=5)
        deadline = time.monotonic() + 30
        while True:
            try:
                info = admin.broker_info()
                if info.role == "master":
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                out["error"] = (f"the restored broker did not serve as master (exit {proc.poll()}): "
                                + log_path.read_text()[-800:])
                return out
            time.sleep(0.2)
        address = f"127.0.0.1:{port}"
        reader = Reader(lambda: {name: [address]}, topics=DATA_TOPICS)
        if not asyncio.run(reader.catch_up(time.monotonic() + timeout)):
            out["error"] = ("the restored broker could not be read to its end: "
                            + asyncio.run(_where_stuck(address, reader)))
            return out
        if reader.stuck:
            out["error"] = "the restored broker's queues read again from their start: " + "; ".join(reader.stuck[:10])
            return out
        out["seen"] = {(t, q, o): body for (_g, t, q, o), body in reader.seen.items()}
        out["starts"] = asyncio.run(_starts(address, [(t, n) for (_g, t), n in reader.queues.items()]))
        out["pending"] = sorted(t.transaction_id for state in ("pending", "parked")
                                for t in admin.transactions(state, limit=100000).transactions)
        out["jobs"] = {j.job_id: j.state for j in admin.jobs("all", limit=100000).jobs}
        out["rewritten"] = list(reader.rewritten) + list(reader.went_back)
        return out
    except Exception as e:  # noqa: BLE001 - the checker's `restored unreadable`, not the schedule's end
        out["error"] = f"reading the restored broker failed: {type(e).__name__}: {e}"
        return out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)


async def _starts(address: str, topics: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Every queue's first offset (what retention had deleted before the backup lies below it)."""
    out = {}
    async with AsyncPullConsumer([address], request_timeout=3) as c:
        for topic, count in topics:
            for q in range(count):
                out[(topic, q)] = await c.search_offset(topic, q, 0)
    return out
