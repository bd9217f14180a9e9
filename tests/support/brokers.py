"""Real broker processes for tests: a `txbroker broker` subprocess on free loopback ports, with its
own data dir, that can be killed and restarted on it."""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

from support.waiting import wait_until

TXBROKER = str(Path(sys.executable).parent / "txbroker")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    """A `txbroker broker` subprocess with its own data dir; can be killed and restarted on it.
    `command` and `env`: another release's broker (support/previous.py), this one's by default."""

    command: list[str] = [TXBROKER]
    env: dict[str, str] | None = None

    def __init__(self, data_dir: Path, log_path: Path, extra_args: list[str],
                 admin_tls: ssl.SSLContext | None = None):
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = extra_args
        self.admin_tls = admin_tls  # given: the admin API is HTTPS, checked with this context
        self.port = free_port()
        self.admin_port = free_port()
        self.proc: subprocess.Popen | None = None
        self._started = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"{'https' if self.admin_tls else 'http'}://127.0.0.1:{self.admin_port}"

    def start(self) -> "BrokerProcess":
        # free_port() cannot reserve a port: another test's process may take it before the broker
        # binds. On a first start that is no fault of the broker's: take new ports and start again.
        # A restart keeps its ports (clients know the address).
        for attempt in range(3):
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(
                [*self.command, "broker", "--data-dir", str(self.data_dir), "--listen", self.address,
                 "--admin-listen", f"127.0.0.1:{self.admin_port}", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, env=self.env)
            log.close()
            try:
                # polled every 20 ms, not backing off: a suite starts about 800 brokers, each ready
                # in 0.5 s or so, and a refused connection costs the poll nothing
                wait_until(self._ready, 20, what=f"broker on {self.address} to be ready (log: {self.log_path})",
                           interval=0.02)
            except AssertionError:
                if self._started or attempt == 2 or "address already in use" not in self.log()[-2000:]:
                    raise
                self.port, self.admin_port = free_port(), free_port()
                continue
            self._started = True
            return self

    def start_until_exit(self, timeout: float = 30) -> int:
        """Start it and wait for it to stop by itself; its exit code. A broker that stops by design
        (a slave whose master deleted what it needs stops to be seeded) may report ready for a
        moment first: its slave role is up before its master's answer comes."""
        try:
            self.start()
        except AssertionError as e:
            if "broker exited with" not in str(e):
                raise
        return self.proc.wait(timeout)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"broker exited with {self.proc.returncode}: {self.log()[-2000:]}")
        try:
            with urllib.request.urlopen(self.admin_url + "/readyz", timeout=1, context=self.admin_tls) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self, sig: int = signal.SIGKILL) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(20)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        return self.kill(signal.SIGTERM)

    def restart(self) -> "BrokerProcess":
        self.stop()
        return self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")
