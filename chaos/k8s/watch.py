"""What the runner watches on the node while a schedule runs, and how it waits for the cluster to
settle.

Watcher: twice a second, every broker pod's admin API (`/api/v1/broker`, from the node, each with a
1 s timeout, all at once). Per look, the brokers of a group answering as master, unfenced, at one
epoch: two of them is the checker's split brain (as chaos/controller.py records it for the local
harness). It also notes when each (group, epoch) was first seen served by a master: the promotions,
for the time to the first acknowledged commit after each. And it copies the pods' logs off the node
as they grow (the kubelet's files, before a force-deleted pod's or a twice-restarted container's
go), for a failing schedule's post-mortem.

Settling: as chaos/schedule.py's `_settle`: until every group's master (as the TxBroker's status
names it) answers as master with nothing pending, parked or undecided and its whole log published
(durable == log end).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from txbroker.client.admin import AdminClient

from chaos.k8s.deploy import Deployment, check_cluster


class Watcher:
    def __init__(self, d: Deployment, pod_logs: Path, copy_to: Path, interval: float = 0.5):
        self.d, self.interval = d, interval
        self.pod_logs, self.copy_to = pod_logs, copy_to
        self.acting: list[dict] = []  # looks with two brokers of one group acting as master at one epoch
        self.promotions: dict[str, dict] = {}  # "g@epoch" -> {at (wall), mono, by}
        self.looks = 0
        self.loads: list[float] = []  # the machine's 1-minute load average at each look
        self.errors = 0
        self._offsets: dict[Path, int] = {}
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(8)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Watcher":
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(30)
        self._pool.shutdown(wait=False)
        self.copy_logs()

    @staticmethod
    def _info(ip: str):
        try:
            return AdminClient(f"http://{ip}:10912", timeout=1).broker_info()
        except Exception:  # noqa: BLE001 - paused, cut off, restarting: no answer this look
            return None

    def _run(self) -> None:
        last_copy = 0.0
        while not self._stop.is_set():
            try:
                self.look()
            except Exception:  # noqa: BLE001 - the API server busy: the next look
                self.errors += 1
            if time.monotonic() - last_copy > 1:
                last_copy = time.monotonic()
                self.copy_logs()
            self._stop.wait(self.interval)

    def look(self) -> None:
        pods = [p for p in self.d.broker_pods() if (p.get("status") or {}).get("podIP")]
        infos = list(self._pool.map(lambda p: self._info(p["status"]["podIP"]), pods))
        now, mono = time.time(), time.monotonic()
        self.looks += 1
        self.loads.append(os.getloadavg()[0])
        by_group: dict[str, dict[int, list[str]]] = {}
        for p, info in zip(pods, infos):
            if info is None or info.role != "master" or info.fenced_by:
                continue
            group = p["metadata"]["labels"].get("txbroker.dev/group", "g0")
            by_group.setdefault(group, {}).setdefault(info.epoch, []).append(p["metadata"]["name"])
            key = f"{group}@{info.epoch}"
            if key not in self.promotions:
                self.promotions[key] = {"at": now, "mono": mono, "by": p["metadata"]["name"]}
        for group, epochs in by_group.items():
            if any(len(names) > 1 for names in epochs.values()):
                self.acting.append({"at": now, "group": group, "acting": epochs})

    def masters_by_epoch(self) -> dict[str, set[str]]:
        """For checker.check: "g@epoch" -> the brokers seen acting as its master in one look together."""
        out: dict[str, set[str]] = {}
        for a in self.acting:
            for epoch, names in a["acting"].items():
                out.setdefault(f"{a['group']}@{epoch}", set()).update(names)
        return out

    def copy_logs(self) -> None:
        """The kubelet's log files of this namespace's pods, appended to copies as they grow."""
        for path in self.pod_logs.glob(f"{self.d.namespace}_*/*/*.log"):
            pod_dir = path.parent.parent.name  # <namespace>_<pod>_<uid>
            _, pod, uid = pod_dir.split("_", 2)
            out = self.copy_to / f"{pod}-{uid[:8]}-{path.parent.name}-{path.stem}.log"
            try:
                size = path.stat().st_size
                start = self._offsets.get(path, 0)
                if size < start:  # rotated
                    start = 0
                if size > start:
                    with open(path, "rb") as src, open(out, "ab") as dst:
                        src.seek(start)
                        shutil.copyfileobj(src, dst)
                    self._offsets[path] = size
            except OSError:
                continue  # gone with its pod meanwhile


def settle(d: Deployment, timeout: float) -> tuple[dict[str, int], float]:
    """Until every group's master serves with nothing pending, parked or undecided and its whole log
    published; what each still holds when the time is up (-1: its master could not be asked), and
    how long it took."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    held: dict[str, int] = {}
    while time.monotonic() < deadline:
        check_cluster()
        held = {}
        try:
            groups = d.groups()
            ips = {p["metadata"]["name"]: (p.get("status") or {}).get("podIP") for p in d.broker_pods()}
        except Exception:  # noqa: BLE001 - the API server busy
            time.sleep(1)
            continue
        for name, g in groups.items():
            try:
                admin = AdminClient(f"http://{ips[g['master']]}:10912", timeout=3)
                info = admin.broker_info()
                n = admin.transactions("pending", limit=0).total + admin.transactions("parked", limit=0).total \
                    + admin.jobs("undecided", limit=0).total
                held[name] = n if info.role == "master" and info.durable_offset == info.log_end_offset else max(n, 1)
            except Exception:  # noqa: BLE001 - the master may be changing
                held[name] = -1
        if held and all(n == 0 for n in held.values()):
            return held, time.monotonic() - t0
        time.sleep(1)
    return held, time.monotonic() - t0
