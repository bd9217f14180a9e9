"""Helpers for the Spark tests: a broker environment, its jobs, consumers, driver subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from support.waiting import wait_until
from txbroker.client.admin import AdminClient

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "spark_driver.py"
GROUP = "spark-tests"
# Every transaction of the group must join a job (TxProducerGroup checkMode ledger): the broker ends
# them from the job's decision. Fast check-back, so anything checked back would show at once.
GROUP_SETTINGS = {"check_interval_ms": 300, "timeout_ms": 200, "check_max": 10000, "require_job": True}


def free_port_unused() -> int:
    """A loopback port nothing listens on (for 'unknown broker' cases)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def admin(url: str, method: str, path: str, body=None):
    return AdminClient(url).request(method, path, body)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class TxEnv:
    broker: object  # conftest.BrokerProcess
    group: str = GROUP
    # a secured broker: an AdminClient with admin credentials (and TLS), and credentials=/tls= for consumers
    admin_client: object = None
    client_kwargs: dict | None = None

    @property
    def brokers(self) -> str:
        return self.broker.address

    @property
    def admin_url(self) -> str:
        return self.broker.admin_url

    def options(self, topic: str, **extra) -> dict:
        opts = {"brokers": self.brokers, "topic": topic, "producerGroup": self.group}
        opts.update({k: str(v) for k, v in extra.items()})
        return opts

    def _admin(self, method: str, path: str, body=None):
        if self.admin_client is not None:
            return self.admin_client.request(method, path, body)
        return admin(self.admin_url, method, path, body)

    def pending(self) -> list[dict]:
        return self._admin("GET", f"/api/v1/transactions?group={self.group}&limit=100000")["transactions"]

    def wait_settled(self, timeout: float = 90.0) -> None:
        wait_until(lambda: not self.pending(), timeout, "every half transaction to be committed or rolled back")

    def transaction(self, txid: str) -> dict:
        return self._admin("GET", f"/api/v1/transactions/{txid}")

    def events(self, topic: str):
        from txbroker.client import PullConsumer

        with PullConsumer(self.brokers, **(self.client_kwargs or {})) as c:
            try:
                return c.read_all(topic)
            except Exception as e:  # noqa: BLE001 - a topic nobody published to does not exist
                if "TOPIC_NOT_EXIST" in str(e):
                    return []
                raise

    def jobs(self) -> list[dict]:
        """The group's jobs (coordinated transactions) on the broker, newest first."""
        return self._admin("GET", f"/api/v1/jobs?group={self.group}&limit=1000")["jobs"]

    def job(self, job_id: str) -> dict:
        """One job, with its member ids (the prepared or kept list)."""
        return self._admin("GET", f"/api/v1/jobs/{job_id}")

    def only_job(self) -> dict:
        jobs = self.jobs()
        assert len(jobs) == 1, jobs
        return self.job(jobs[0]["job_id"])

    def wait_job(self, predicate, timeout: float = 90.0, what: str = "the job") -> dict:
        def seen():
            jobs = self.jobs()
            return next((self.job(j["job_id"]) for j in jobs if predicate(j)), None)

        return wait_until(seen, timeout, what)

    def metric(self, name: str, label: str = "") -> float:
        """Sum of a Prometheus counter's samples (optionally those with `label`, e.g. 'kind="half"')."""
        with urllib.request.urlopen(self.admin_url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line:
                total += float(line.rsplit(" ", 1)[1])
        return total


def bodies_by_id(events) -> Counter:
    return Counter(json.loads(m.body)["id"] for m in events)


def dataset_rows(ids) -> list[dict]:
    """The rows spark_driver.py writes (batch: spark.range; stream: write_input_files), as JSON bodies."""
    return [{"id": i, "payload": f"row-{i}"} for i in sorted(ids)]


def assert_published_once(events, ids) -> None:
    """What a consumer checks against the committed dataset: each row exactly once, with its content."""
    counts = bodies_by_id(events)
    dupes = sorted(i for i, c in counts.items() if c > 1)
    assert not dupes, f"rows delivered more than once: {dupes[:10]}"
    assert sorted(counts) == sorted(ids), f"missing {sorted(set(ids) - set(counts))[:10]}, " \
                                          f"unexpected {sorted(set(counts) - set(ids))[:10]}"
    bodies = sorted((json.loads(m.body) for m in events), key=lambda b: b["id"])
    assert bodies == dataset_rows(ids), next(b for b, r in zip(bodies, dataset_rows(ids)) if b != r)


def spawn_driver(*args: str, log_path: Path, env: dict | None = None) -> subprocess.Popen:
    """A Spark driver in its own process group (so the test can SIGKILL the driver, its JVM and workers)."""
    log = open(log_path, "ab")
    proc = subprocess.Popen([sys.executable, str(DRIVER), *args], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, **(env or {})})
    log.close()
    return proc


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the driver's whole process group (the Python driver, its JVM, the Python workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def wait_marker(path: Path, proc: subprocess.Popen, log_path: Path, timeout: float = 240.0) -> dict:
    def seen():
        if proc.poll() is not None:
            raise AssertionError(f"driver exited {proc.returncode} before the hook: {log_path.read_text()[-3000:]}")
        return path.exists()

    wait_until(seen, timeout, f"the driver to reach its hook ({path.name})")
    return json.loads(path.read_text())


def run_driver(*args: str, log_path: Path, timeout: float = 300.0) -> None:
    proc = spawn_driver(*args, log_path=log_path)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise AssertionError(f"driver did not finish in {timeout}s: {log_path.read_text()[-3000:]}") from None
    finally:
        if proc.poll() is None:
            kill_group(proc)
    assert code == 0, f"driver exited {code}: {log_path.read_text()[-4000:]}"


def write_input_files(directory: Path, files: int, rows_per_file: int) -> list[int]:
    """JSON-lines input for a file stream: one micro-batch per file (maxFilesPerTrigger=1)."""
    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 3600
    ids = []
    for f in range(files):
        lines = []
        for r in range(rows_per_file):
            i = f * rows_per_file + r
            ids.append(i)
            lines.append(json.dumps({"id": i, "payload": f"row-{i}"}))
        tmp = directory / f".f{f:03d}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.utime(tmp, (base + f, base + f))  # the file source takes files in modification order
        os.replace(tmp, directory / f"f{f:03d}.json")
    return ids


@dataclass
class ClusterEnv:
    """A cluster of broker groups (tests/support/groups.py), the group's settings on every master."""

    cluster: object  # support.groups.Cluster
    group: str = GROUP

    @property
    def brokers(self) -> str:
        return ",".join(self.cluster.bootstrap)

    def options(self, topic: str, **extra) -> dict:
        opts = {"brokers": self.brokers, "topic": topic, "producerGroup": self.group}
        opts.update({k: str(v) for k, v in extra.items()})
        return opts

    def admin(self, group: str) -> AdminClient:
        return AdminClient(self.cluster.group(group).master.admin_url)

    def located(self, topic: str) -> list[tuple[str, object]]:
        """What a consumer reads of `topic` on every group: (group, message)."""
        from txbroker.client import PullConsumer

        out = []
        for g in self.cluster.groups:
            with PullConsumer(g.master.address) as c:
                try:
                    out += [(g.name, m) for m in c.read_all(topic)]
                except Exception as e:  # noqa: BLE001 - a topic nobody published to does not exist
                    if "TOPIC_NOT_EXIST" not in str(e):
                        raise
        return out

    def events(self, topic: str) -> list:
        return [m for _g, m in self.located(topic)]

    def jobs(self) -> list[dict]:
        """Every group's jobs (a job spanning groups: its home's, and its entries elsewhere)."""
        out = []
        for g in self.cluster.groups:
            for j in self.admin(g.name).get(f"/api/v1/jobs?group={self.group}&limit=1000")["jobs"]:
                out.append({**self.admin(g.name).get(f"/api/v1/jobs/{j['job_id']}"), "at": g.name})
        return out

    def homes(self) -> list[dict]:
        return [j for j in self.jobs() if not j["home"]]

    def pending(self) -> list[dict]:
        return [t for g in self.cluster.groups
                for t in self.admin(g.name).get(f"/api/v1/transactions?group={self.group}&limit=100000")["transactions"]]

    def wait_settled(self, timeout: float = 90.0) -> None:
        wait_until(lambda: not self.pending(), timeout, "every half transaction to be committed or rolled back")
