"""Python side of the Kubernetes testbed (tests/k8s/testbed.sh): used by tests/e2e/conftest.py.

    tb = Testbed(state_dir); tb.start(); ...; tb.stop()

One testbed per pytest(-xdist) worker: each has its own etcd, kube-apiserver (free ports),
kube-controller-manager (garbage collector, namespace and endpoint controllers only) and local kubelet
(its own /24 of loopback pod addresses), so workers share nothing and tear down alone.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.waiting import wait_for  # noqa: F401 - the e2e tests import it from here

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TESTBED_SH = HERE / "testbed.sh"

_spec = importlib.util.spec_from_file_location("txbroker_local_kubelet", HERE / "kubelet.py")
kubelet = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = kubelet
_spec.loader.exec_module(kubelet)


class TestbedError(RuntimeError):
    pass


class ToolError(subprocess.CalledProcessError):
    """A kubectl/helm call failed; str() shows its stderr."""

    def __str__(self) -> str:
        return f"{' '.join(map(str, self.cmd[:1] + self.cmd[1:]))} exited {self.returncode}:\n{self.stderr}"


def build() -> None:
    """Build whatever binary is missing (slow the first time; cached under ~/.cache/txbroker)."""
    r = subprocess.run(["bash", str(TESTBED_SH), "build"], capture_output=True, text=True)
    if r.returncode != 0:
        raise TestbedError((r.stderr or r.stdout).strip()[-4000:])


def bin_dir() -> Path:
    return Path(subprocess.run(["bash", str(TESTBED_SH), "bin"], capture_output=True, text=True,
                               check=True).stdout.strip())


class Testbed:
    __test__ = False   # not a test class

    # the processes `testbed.sh start` runs: logs in DIR/logs/<name>.log, pids in DIR/pids
    COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kubelet")

    def __init__(self, state_dir: Path, pod_path: str | None = None):
        self.dir = Path(state_dir).resolve()
        self.bin = bin_dir()
        # PATH of pod processes (the kubelet's own PATH): the interpreter's bin dir first, so an
        # image's `txbroker` command is this checkout's CLI (.venv/bin/txbroker).
        venv_bin = str(Path(sys.executable).parent)
        self.pod_path = pod_path or os.environ.get("TXBROKER_TESTBED_PATH") or \
            os.pathsep.join([venv_bin, os.environ.get("PATH", "")])
        self.started = False

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def kubelet_dir(self) -> Path:
        return self.dir / "kubelet"

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for kubectl, helm and operators run against the testbed."""
        env = dict(os.environ)
        env.update(KUBECONFIG=str(self.kubeconfig), PATH=os.pathsep.join([str(self.bin), self.pod_path]),
                   HELM_CACHE_HOME=str(self.dir / "helm" / "cache"),
                   HELM_CONFIG_HOME=str(self.dir / "helm" / "config"),
                   HELM_DATA_HOME=str(self.dir / "helm" / "data"))
        env.update(extra)
        return env

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        env = dict(os.environ, PATH=self.pod_path, PYTHON=sys.executable)
        self.started = True
        atexit.register(self.stop)   # also when pytest is interrupted
        r = subprocess.run(["bash", str(TESTBED_SH), "start", str(self.dir)], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.stop()
            raise TestbedError(f"testbed start failed:\n{r.stderr[-4000:]}")

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        subprocess.run(["bash", str(TESTBED_SH), "stop", str(self.dir)], capture_output=True, text=True)

    # -- tools ---------------------------------------------------------------------------------

    def run(self, tool: str, *args: str, input: str | None = None, check: bool = True,
            env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / tool), *args]
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, env=env or self.env(),
                           timeout=timeout)
        if check and r.returncode != 0:
            raise ToolError(r.returncode, cmd, r.stdout, r.stderr)
        return r

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.run("kubectl", *args, **kw)

    def helm(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.run("helm", *args, **kw)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
        r = self.kubectl(*args, check=False)
        if r.returncode != 0:
            if "NotFound" in r.stderr:
                return None
            raise subprocess.CalledProcessError(r.returncode, args, r.stdout, r.stderr)
        return json.loads(r.stdout)

    def apply(self, manifest: dict | str, namespace: str | None = None) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", "-f", "-", *(["-n", namespace] if namespace else []), input=text)

    def create_namespace(self, name: str) -> str:
        r = self.kubectl("create", "namespace", name, check=False)
        if r.returncode != 0 and "AlreadyExists" not in r.stderr:
            raise subprocess.CalledProcessError(r.returncode, "kubectl create namespace", r.stdout, r.stderr)
        return name

    def delete_namespace(self, name: str) -> None:
        """Start deleting a namespace, without waiting: the controller manager's namespace controller
        deletes what is in it (pods take their grace period), then the namespace itself."""
        self.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")

    def rest(self, kubeconfig: Path | None = None):
        """A small JSON REST client (request, watch) on the admin kubeconfig (or another)."""
        return kubelet.Rest(str(kubeconfig or self.kubeconfig))

    # -- the local kubelet ---------------------------------------------------------------------

    def kill_pod(self, name: str, namespace: str = "default", sig: int = signal.SIGKILL) -> list[int]:
        """Signal the processes of a pod's containers (SIGKILL: a crash, as an OOM kill would be)."""
        return kubelet.kill_pod(self.kubelet_dir, namespace, name, sig)

    def pod_pids(self, name: str, namespace: str = "default") -> dict[str, int]:
        return kubelet.pod_pids(self.kubelet_dir, namespace, name)

    def pod_log(self, name: str, namespace: str = "default", container: str | None = None) -> str:
        logs = kubelet.pod_dir(self.kubelet_dir, namespace, name) / "logs"
        files = [logs / f"{container}.log"] if container else sorted(logs.glob("*.log"))
        return "".join(f.read_text(errors="replace") for f in files if f.exists())

    def component_log(self, component: str) -> str:
        f = self.dir / "logs" / f"{component}.log"
        return f.read_text(errors="replace") if f.exists() else ""

    def component_pid(self, component: str) -> int | None:
        """The pid of one of COMPONENTS as `start` recorded it (None when it was not started)."""
        f = self.dir / "pids"
        pids = [int(p) for n, p in (line.split() for line in f.read_text().splitlines() if line.strip())
                if n == component] if f.exists() else []
        return pids[-1] if pids else None
