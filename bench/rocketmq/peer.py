"""Apache RocketMQ as a side-by-side peer for txbroker's benchmarks (tracker issue 8).

``RocketMQPeer`` is a context manager that starts a name server and a broker (or, with
``proxy=True``, a name server and a proxy in *local* mode, which runs the broker inside the proxy
process; or, with ``brokers=2``, two broker groups: masters ``broker-a`` and ``broker-b`` of one
cluster under the one name server, each with its own store, ports and log home, ``create_topic``
putting a topic on both) by calling ``java`` directly: the shipped ``bin/*.sh`` scripts pass JVM
flags that Java 17 rejects. Everything lives in a fresh temporary directory (ROCKETMQ_HOME, ``-Drocketmq.home.dir``,
``-Duser.home`` so the logs land there, the store). On exit, normal or by exception, every process it
started is stopped (SIGTERM to its process group, SIGKILL after a grace period) and the directory is
removed unless ``keep_dir`` is set.

    from peer import RocketMQPeer
    with RocketMQPeer(flush="SYNC_FLUSH") as mq:
        mq.create_topic("T", queues=8)
        subprocess.run(mq.java_cmd("TxBench", "tx", "-n", mq.namesrv_addr, ...))

Broker settings: RocketMQ's documented defaults, except what a single-machine benchmark needs
(listen ports picked free, ``brokerIP1=127.0.0.1``, ``autoCreateTopicEnable=true``, the store in the
temp dir) and what the caller passes in ``broker_overrides`` (workload 2 sets
``transactionCheckInterval``; see workloads.py). ``effective_broker_conf`` records all of it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_VERSION = "5.3.3"

# Java 17-compatible subset of the flags in RocketMQ's runserver.sh / runbroker.sh (their Java 11 branch),
# with small heaps for a 2-core machine that also runs other work.
COMMON_JVM = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:G1HeapRegionSize=16m",
    "-XX:G1ReservePercent=25",
    "-XX:InitiatingHeapOccupancyPercent=30",
    "-XX:SoftRefLRUPolicyMSPerMB=0",
    "-XX:-OmitStackTraceInFastThrow",
    "-XX:-UseLargePages",
    "--add-exports", "java.base/jdk.internal.ref=ALL-UNNAMED",   # lets the store unmap its files
    "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
]


class PeerError(RuntimeError):
    pass


def fetch(version: str = DEFAULT_VERSION) -> Path:
    """Run fetch.sh (cached: quick when done before) and return ~/.cache/txbroker/rocketmq-<version>."""
    env = dict(os.environ, ROCKETMQ_VERSION=version)
    out = subprocess.run(["bash", str(HERE / "fetch.sh")], env=env, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _free_block(offsets: list[int], lo: int = 20000, hi: int = 40000, taken: set[int] | None = None) -> int:
    """A base port P such that P+o is free for every o in offsets."""
    import random
    taken = taken or set()
    for _ in range(500):
        base = random.randrange(lo, hi)
        ports = [base + o for o in offsets]
        if not taken.intersection(ports) and all(_port_free(p) for p in ports):
            taken.update(ports)
            return base
    raise PeerError("no free port block found")


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class RocketMQPeer:
    """Name server + broker (or + proxy in local mode) of Apache RocketMQ, started for one ``with`` block."""

    def __init__(self, *, version: str = DEFAULT_VERSION, flush: str = "ASYNC_FLUSH", proxy: bool = False,
                 broker_heap: str = "1g", namesrv_heap: str = "256m",
                 broker_overrides: dict | None = None, start_timeout: float = 90.0, brokers: int = 1,
                 stop_timeout: float = 40.0, keep_dir: bool = False, java: str = "java",
                 workdir_parent: str | None = None, log=print):
        if flush not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            raise ValueError("flush must be ASYNC_FLUSH or SYNC_FLUSH")
        self.version = version
        self.flush = flush
        self.proxy = proxy
        if brokers < 1 or (proxy and brokers != 1):
            raise ValueError("brokers: 1 or more, and 1 with the proxy")
        self.brokers = brokers
        self.broker_heap = broker_heap
        self.namesrv_heap = namesrv_heap
        self.broker_overrides = dict(broker_overrides or {})
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.keep_dir = keep_dir
        self.java = java
        self.workdir_parent = workdir_parent
        self.log = log
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.commands: dict[str, list[str]] = {}
        self.dir: Path | None = None
        self.dist: Path | None = None
        self.namesrv_port = self.broker_port = self.grpc_port = self.proxy_remoting_port = None
        self.effective_broker_conf: dict[str, str] = {}
        self.broker_ports: list[int] = []  # one per broker group (brokers > 1)
        self.broker_confs: list[dict[str, str]] = []

    # ------------------------------------------------------------ paths/commands
    @property
    def lib(self) -> Path:
        return self.dist / "lib"

    @property
    def classpath(self) -> str:
        return f"{self.dist / 'bench-classes'}:{self.lib}/*"

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def broker_pids(self) -> list[int]:
        """Every broker JVM (one per broker group; the proxy JVM holding the broker with proxy=True)."""
        return [p.pid for n, p in self.procs if n.startswith("broker") or n == "proxy"]

    def java_cmd(self, main_class: str, *args: str, heap: str = "512m", extra_jvm: list[str] | None = None) -> list[str]:
        """A java command line on the peer's classpath (client tools, our TxBench driver)."""
        return [self.java, f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC",
                f"-Duser.home={self.dir / 'client-home'}", f"-Drocketmq.home.dir={self.dir / 'home'}",
                *(extra_jvm or []), "-cp", self.classpath, main_class, *args]

    # ----------------------------------------------------------------- start
    def __enter__(self) -> "RocketMQPeer":
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _start(self) -> None:
        self.dist = fetch(self.version)
        self.dir = Path(tempfile.mkdtemp(prefix="txbroker-rocketmq-", dir=self.workdir_parent))
        home = self.dir / "home"
        (home / "conf").mkdir(parents=True)
        (self.dir / "client-home").mkdir()
        store = self.dir / "store"
        taken: set[int] = set()
        self.namesrv_port = _free_block([0], taken=taken)
        # broker: listenPort P, fast (VIP) remoting P-2, HA P+1
        self.broker_port = _free_block([-2, 0, 1], taken=taken)
        self.broker_ports = [self.broker_port] + [_free_block([-2, 0, 1], taken=taken)
                                                  for _ in range(self.brokers - 1)]
        if self.proxy:
            self.grpc_port = _free_block([0], taken=taken)
            self.proxy_remoting_port = _free_block([0], taken=taken)

        env = dict(os.environ, ROCKETMQ_HOME=str(home), RMQ_PROXY_HOME=str(home))
        env.pop("JAVA_TOOL_OPTIONS", None)
        sysprops = [f"-Drocketmq.home.dir={home}", f"-Duser.home={home}"]

        ns_conf = self.dir / "namesrv.conf"
        ns_conf.write_text(f"listenPort={self.namesrv_port}\n")
        ns_cmd = [self.java, f"-Xms{self.namesrv_heap}", f"-Xmx{self.namesrv_heap}", *COMMON_JVM,
                  "-XX:MaxDirectMemorySize=256m", *sysprops, "-cp", f"{self.lib}/*",
                  "org.apache.rocketmq.namesrv.NamesrvStartup", "-c", str(ns_conf)]
        self._spawn("namesrv", ns_cmd, env)
        self._wait("namesrv", lambda: _port_open(self.namesrv_port), "boot success")

        conf = {
            "brokerClusterName": "DefaultCluster",
            "brokerName": "broker-a",
            "brokerId": "0",
            "brokerRole": "ASYNC_MASTER",       # single broker, no slave
            "flushDiskType": self.flush,
            "listenPort": str(self.broker_port),
            "namesrvAddr": self.namesrv_addr,
            "brokerIP1": "127.0.0.1",
            "autoCreateTopicEnable": "true",
            "storePathRootDir": str(store),
            "storePathCommitLog": str(store / "commitlog"),
            # deleteWhen / fileReservedTime etc.: documented defaults
        }
        conf.update({k: str(v) for k, v in self.broker_overrides.items()})
        self.effective_broker_conf = conf
        broker_conf = self.dir / "broker.conf"
        broker_conf.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))

        broker_jvm = [self.java, f"-Xms{self.broker_heap}", f"-Xmx{self.broker_heap}", *COMMON_JVM,
                      "-XX:MaxDirectMemorySize=1g", *sysprops, "-cp", f"{self.lib}/*"]
        if not self.proxy:
            self.broker_confs = [conf]
            for i, port in enumerate(self.broker_ports):
                name, path = "broker", broker_conf
                if i:  # another broker group: its own name, ports and store; the same cluster and name server
                    letter = chr(ord("a") + i)
                    name, path = f"broker-{letter}", self.dir / f"broker-{letter}.conf"
                    other = dict(conf, brokerName=f"broker-{letter}", listenPort=str(port),
                                 storePathRootDir=str(self.dir / f"store-{letter}"),
                                 storePathCommitLog=str(self.dir / f"store-{letter}" / "commitlog"))
                    self.broker_confs.append(other)
                    path.write_text("".join(f"{k}={v}\n" for k, v in other.items()))
                jvm = broker_jvm
                if i:  # its logs under a home of its own
                    (self.dir / f"home-{letter}").mkdir()
                    jvm = [f"-Duser.home={self.dir / f'home-{letter}'}" if x == f"-Duser.home={home}" else x
                           for x in broker_jvm]
                cmd = jvm + ["org.apache.rocketmq.broker.BrokerStartup", "-c", str(path), "-n", self.namesrv_addr]
                self._spawn(name, cmd, env)
                self._wait(name, lambda port=port: _port_open(port), "boot success")
        else:
            import json
            pconf = self.dir / "rmq-proxy.json"
            pconf.write_text(json.dumps({
                "rocketMQClusterName": "DefaultCluster",
                "namesrvAddr": self.namesrv_addr,
                "proxyMode": "local",
                "grpcServerPort": self.grpc_port,
                "remotingListenPort": self.proxy_remoting_port,
            }, indent=1))
            cmd = broker_jvm + ["org.apache.rocketmq.proxy.ProxyStartup", "-pm", "local",
                                "-pc", str(pconf), "-bc", str(broker_conf), "-n", self.namesrv_addr]
            self._spawn("proxy", cmd, env)
            self._wait("proxy", lambda: _port_open(self.broker_port) and _port_open(self.grpc_port), None)
        self._wait_broker_registered()

    def _spawn(self, name: str, cmd: list[str], env: dict) -> None:
        out = open(self.dir / f"{name}.out", "wb")
        self.commands[name] = cmd
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, cwd=self.dir, start_new_session=True)
        out.close()
        self.procs.append((name, p))
        self.log(f"[rocketmq] started {name} pid={p.pid}")

    def _wait(self, name: str, ready, marker: str | None) -> None:
        deadline = time.monotonic() + self.start_timeout
        proc = dict(self.procs)[name]
        outfile = self.dir / f"{name}.out"
        while time.monotonic() < deadline:
            if _exited_unreaped(proc.pid):
                raise PeerError(f"{name} exited during start-up:\n{outfile.read_text(errors='replace')[-3000:]}")
            text = outfile.read_text(errors="replace") if outfile.exists() else ""
            if ready() and (marker is None or marker in text):
                return
            time.sleep(0.3)
        raise PeerError(f"{name} not ready within {self.start_timeout}s:\n{outfile.read_text(errors='replace')[-3000:]}")

    def _wait_broker_registered(self) -> None:
        """The broker is usable once the name server knows it: ask with mqadmin clusterList."""
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            r = self.mqadmin("clusterList", check=False)
            last = r.stdout + r.stderr
            if r.returncode == 0 and all(f"127.0.0.1:{p}" in last for p in self.broker_ports or [self.broker_port]):
                return
            time.sleep(1)
        raise PeerError(f"broker not registered with the name server:\n{last[-2000:]}")

    # ----------------------------------------------------------------- admin
    def mqadmin(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = self.java_cmd("org.apache.rocketmq.tools.command.MQAdminStartup", *args, "-n", self.namesrv_addr,
                            heap="256m")
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
                           env=dict(os.environ, ROCKETMQ_HOME=str(self.dir / "home")), start_new_session=True)
        if check and r.returncode != 0:
            raise PeerError(f"mqadmin {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r

    def create_topic(self, topic: str, queues: int = 8) -> None:
        r = self.mqadmin("updateTopic", "-c", "DefaultCluster", "-t", topic, "-r", str(queues), "-w", str(queues))
        if "success" not in r.stdout.lower():
            raise PeerError(f"updateTopic {topic}: {r.stdout}\n{r.stderr}")

    def describe(self) -> dict:
        return {
            "version": self.version,
            "flush": self.flush,
            "mode": "namesrv+proxy(local, embedded broker)" if self.proxy else (
                f"namesrv+{self.brokers} broker groups (masters)" if self.brokers > 1 else "namesrv+broker"),
            "namesrv": self.namesrv_addr,
            "broker_conf": self.effective_broker_conf,
            **({"broker_groups": self.broker_confs} if self.brokers > 1 else {}),
            "commands": {k: " ".join(v) for k, v in self.commands.items()},
            "heaps": {"namesrv": self.namesrv_heap, "broker": self.broker_heap},
        }

    def log_tail(self, name: str = "broker.log", lines: int = 50) -> str:
        p = self.dir / "home" / "logs" / "rocketmqlogs" / name
        if not p.exists():
            return ""
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:])

    # ------------------------------------------------------------------ stop
    def _stop(self) -> None:
        # reverse order: broker/proxy first (it unregisters from the name server), then namesrv
        for name, p in reversed(self.procs):
            self._terminate(name, p)
        self.procs.clear()
        if self.dir and not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _terminate(self, name: str, p: subprocess.Popen) -> None:
        stop_group(p, self.stop_timeout, on_kill=lambda: self.log(
            f"[rocketmq] {name} pid={p.pid} ignored SIGTERM for {self.stop_timeout}s: SIGKILL"))
        self.log(f"[rocketmq] stopped {name} pid={p.pid} rc={p.returncode}")


def _exited_unreaped(pid: int) -> bool:
    """True once the child has exited; it is NOT reaped, so its pid/process-group id stay ours."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def stop_group(p: subprocess.Popen, grace: float, sig: int = signal.SIGTERM, on_kill=None) -> None:
    """Stop a child started with start_new_session=True and everything in its process group:
    ``sig`` to the group, up to ``grace`` seconds, then SIGKILL to the group (which also sweeps up any
    of its children), then reap. The leader is reaped only at the end, so the group id cannot have
    been reused by an unrelated process while we signal it."""
    if p.returncode is not None:      # already reaped by us earlier
        return
    if not _exited_unreaped(p.pid):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while not _exited_unreaped(p.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not _exited_unreaped(p.pid) and on_kill:
            on_kill()
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def run_bounded(cmd: list[str], timeout: float, env: dict | None = None, cwd: str | None = None,
                on_line=None) -> tuple[int, str]:
    """Run a client command in its own process group; kill the whole group if it overruns.
    Returns (returncode, combined output)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env=env, cwd=cwd, text=True, start_new_session=True)
    lines: list[str] = []
    import threading

    def pump():
        for line in p.stdout:
            lines.append(line)
            if on_line:
                on_line(line.rstrip("\n"))

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + timeout
        while not _exited_unreaped(p.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        stop_group(p, 15)           # no-op signal-wise when it already exited; sweeps leftovers
    except BaseException:
        stop_group(p, 0, sig=signal.SIGKILL)
        raise
    t.join(5)
    return p.returncode, "".join(lines)
