"""The ledger: a durable record of what each Spark job decided, which check-back consults.

Everything is a small JSON file under one directory (a local disk in local mode, a shared volume
on Kubernetes, mounted by the driver and by the checker; executors never touch it):

    LEDGER/jobs/<job>/start.json        the job is running: driver host/pid, deadline, when
    LEDGER/jobs/<job>/prepared.json     deferred commit: the job's transaction ids, awaiting the app
    LEDGER/jobs/<job>/decision.json     THE decision: COMMITTED (with its transaction ids) or ABORTED
    LEDGER/streams/<query>/driver.json  the driver currently running the streaming query
    LEDGER/streams/<query>/epoch        bumped each time a batch of the query is aborted
    LEDGER/streams/<query>/<batch>/e<epoch>.json   decision for one micro-batch at one epoch

Files are written to a temporary name, fsynced, and moved into place; decisions are *created*
exclusively (a hard link, which fails if the name exists), so the first of the driver's commit and
the checker's abort wins and the loser reads the winner's decision: a job is never both committed
and rolled back. The directory is fsynced after each change.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

COMMITTED = "COMMITTED"
ABORTED = "ABORTED"

_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def now_ms() -> int:
    return int(time.time() * 1000)


def check_name(kind: str, name: str) -> str:
    """Job and query ids become file names: keep them to a safe alphabet."""
    if not name or len(name) > 80 or not set(name) <= _SAFE or name.startswith("."):
        raise ValueError(f"{kind} {name!r} must be 1-80 characters from letters, digits, '-', '_', '.'")
    return name


@dataclass
class Decision:
    decision: str  # COMMITTED or ABORTED
    txids: list[str] = field(default_factory=list)
    reason: str = ""
    by: str = ""
    decided_ms: int = 0
    rows: int = 0
    duplicates: int = 0  # prepares that found their transaction already stored (replays)
    attempts: list = field(default_factory=list)  # the task attempts kept: partition, task id, attempt no.
    _set: frozenset | None = field(default=None, repr=False, compare=False)

    def includes(self, txid: str) -> bool:
        if self._set is None:
            self._set = frozenset(self.txids)
        return txid in self._set

    @property
    def committed(self) -> bool:
        return self.decision == COMMITTED

    def to_json(self) -> dict:
        return {"decision": self.decision, "txids": self.txids, "reason": self.reason, "by": self.by,
                "decided_ms": self.decided_ms, "rows": self.rows, "duplicates": self.duplicates,
                "attempts": self.attempts}

    @classmethod
    def from_json(cls, doc: dict) -> "Decision":
        return cls(doc["decision"], list(doc.get("txids", [])), doc.get("reason", ""), doc.get("by", ""),
                   doc.get("decided_ms", 0), doc.get("rows", 0), doc.get("duplicates", 0),
                   list(doc.get("attempts", [])))


# ---- who is the driver, and is it still alive? ------------------------------------------------

def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(command name, parent pid, start time in clock ticks) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    rest = stat[stat.rindex(")") + 2:].split()
    return comm, int(rest[1]), int(rest[19])


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def driver_host() -> str:
    """The host the driver records. $TXBROKER_DRIVER_HOST overrides the machine's name: the tests use
    it to stand for a driver on another host (a pod), whose liveness the checker cannot judge."""
    return os.environ.get("TXBROKER_DRIVER_HOST") or socket.gethostname()


def driver_identity() -> dict:
    """Identify the driver JVM from inside one of its Python workers (or the driver itself).

    The data source's writer is created on the driver, in a Python worker the driver JVM started;
    walking up the parents finds that JVM. Its pid plus its start time name the process
    unambiguously on this host (pids get reused; start times do not repeat).
    """
    ident = {"host": driver_host(), "boot_id": _boot_id(), "pid": None, "start_ticks": None,
             "python_pid": os.getpid()}
    pid = os.getpid()
    for _ in range(8):
        st = _proc_stat(pid)
        if st is None:
            break
        comm, ppid, ticks = st
        if comm == "java":
            ident["pid"], ident["start_ticks"] = pid, ticks
            break
        if ppid <= 1:
            break
        pid = ppid
    return ident


def identity_is_dead(ident: dict | None) -> bool:
    """True only when we can tell for sure: same host and boot, and that process is gone."""
    if not ident or not ident.get("pid") or not os.path.isdir("/proc/self"):
        return False
    if ident.get("host") != socket.gethostname() or ident.get("boot_id") != _boot_id():
        return False  # another machine (a pod): only the deadline can decide
    st = _proc_stat(int(ident["pid"]))
    return st is None or st[2] != ident.get("start_ticks")


# ---- the ledger ------------------------------------------------------------------------------

class Ledger:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().absolute()
        self._cache: dict[Path, Decision] = {}  # decisions never change once written
        self._lock = threading.Lock()

    def ensure(self) -> "Ledger":
        """Create the directory tree and prove it is writable (fails with the path named)."""
        try:
            for sub in ("jobs", "streams"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{uuid.uuid4().hex}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            raise ValueError(f"ledger directory {self.root} is not usable: {e}") from None
        return self

    # -- primitive writes --

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _write_tmp(self, final: Path, doc) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"
        data = json.dumps(doc, separators=(",", ":")).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def _replace(self, final: Path, doc) -> None:
        tmp = self._write_tmp(final, doc)
        os.replace(tmp, final)
        self._fsync_dir(final.parent)

    def _create(self, final: Path, doc) -> bool:
        """Create `final` with `doc` unless it exists; True if this call created it."""
        tmp = self._write_tmp(final, doc)
        try:
            os.link(tmp, final)
            created = True
        except FileExistsError:
            created = False
        except OSError:  # a filesystem without hard links: exclusive create, then the content
            try:
                fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                created = False
            else:
                try:
                    os.write(fd, tmp.read_bytes())
                    os.fsync(fd)
                finally:
                    os.close(fd)
                created = True
        finally:
            tmp.unlink(missing_ok=True)
        self._fsync_dir(final.parent)
        return created

    @staticmethod
    def _read(path: Path):
        for _ in range(50):  # a half-written file (no hard links on this filesystem): read again
            try:
                return json.loads(path.read_bytes())
            except FileNotFoundError:
                return None
            except ValueError:
                time.sleep(0.02)
        raise ValueError(f"ledger file {path} is not valid JSON")

    def _decision_at(self, path: Path) -> Decision | None:
        with self._lock:
            d = self._cache.get(path)
        if d is not None:
            return d
        doc = self._read(path)
        if doc is None:
            return None
        d = Decision.from_json(doc)
        with self._lock:
            self._cache[path] = d
        return d

    def _decide_at(self, path: Path, decision: Decision) -> Decision:
        """Record `decision` unless one exists; return whichever is recorded (first wins)."""
        decision.decided_ms = decision.decided_ms or now_ms()
        if self._create(path, decision.to_json()):
            with self._lock:
                self._cache[path] = decision
            return decision
        return self._decision_at(path)

    # -- batch jobs --

    def job_dir(self, job: str) -> Path:
        return self.root / "jobs" / check_name("job id", job)

    def register_job(self, job: str, *, deadline_ms: int, meta: dict | None = None) -> dict:
        doc = {"job": job, "created_ms": now_ms(), "deadline_ms": deadline_ms, "driver": driver_identity(),
               **(meta or {})}
        self._replace(self.job_dir(job) / "start.json", doc)
        return doc

    def job_start(self, job: str) -> dict | None:
        return self._read(self.job_dir(job) / "start.json")

    def save_prepared(self, job: str, txids: list[str], rows: int, duplicates: int = 0,
                      attempts: list | None = None) -> None:
        self._replace(self.job_dir(job) / "prepared.json",
                      {"txids": txids, "rows": rows, "duplicates": duplicates, "attempts": attempts or [],
                       "prepared_ms": now_ms()})

    def prepared(self, job: str) -> dict | None:
        return self._read(self.job_dir(job) / "prepared.json")

    def decide_job(self, job: str, decision: Decision) -> Decision:
        return self._decide_at(self.job_dir(job) / "decision.json", decision)

    def job_decision(self, job: str) -> Decision | None:
        return self._decision_at(self.job_dir(job) / "decision.json")

    def jobs(self) -> list[str]:
        d = self.root / "jobs"
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []

    # -- streaming queries --

    def stream_dir(self, query: str) -> Path:
        return self.root / "streams" / check_name("query id", query)

    def register_stream_driver(self, query: str, *, deadline_ms: int) -> dict:
        """Record the driver now running the query (rewritten only when it changes)."""
        path = self.stream_dir(query) / "driver.json"
        ident = driver_identity()
        current = self._read(path)
        if current and current.get("driver", {}).get("pid") == ident["pid"] and \
                current.get("driver", {}).get("start_ticks") == ident["start_ticks"] and \
                current["driver"].get("host") == ident["host"] and current.get("deadline_ms") == deadline_ms:
            return current
        doc = {"query": query, "created_ms": now_ms(), "deadline_ms": deadline_ms, "driver": ident}
        self._replace(path, doc)
        return doc

    def stream_driver(self, query: str) -> dict | None:
        return self._read(self.stream_dir(query) / "driver.json")

    def stream_epoch(self, query: str) -> int:
        doc = self._read(self.stream_dir(query) / "epoch")
        return int(doc["epoch"]) if doc else 0

    def bump_stream_epoch(self, query: str, at_least: int) -> None:
        with self._lock:
            if self.stream_epoch(query) < at_least:
                self._replace(self.stream_dir(query) / "epoch", {"epoch": at_least, "changed_ms": now_ms()})

    def _batch_path(self, query: str, batch: int, epoch: int) -> Path:
        return self.stream_dir(query) / str(int(batch)) / f"e{int(epoch)}.json"

    def batch_decision(self, query: str, batch: int, epoch: int) -> Decision | None:
        return self._decision_at(self._batch_path(query, batch, epoch))

    def decide_batch(self, query: str, batch: int, epoch: int, decision: Decision) -> Decision:
        if decision.decision == ABORTED:
            # Bump first: a replay after this abort must use transaction ids the abort cannot touch.
            self.bump_stream_epoch(query, epoch + 1)
        return self._decide_at(self._batch_path(query, batch, epoch), decision)

    def committed_batch(self, query: str, batch: int) -> tuple[int, Decision] | None:
        """The committed decision of a micro-batch at any epoch (there is at most one)."""
        d = self.stream_dir(query) / str(int(batch))
        if not d.is_dir():
            return None
        for p in sorted(d.glob("e*.json")):
            dec = self._decision_at(p)
            if dec is not None and dec.committed:
                return int(p.stem[1:]), dec
        return None
