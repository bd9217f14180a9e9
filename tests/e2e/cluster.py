"""The e2e tests' handle on the real one-node cluster that testbed/cluster.sh runs.

The tests run inside the cluster's network namespace (`testbed/cluster.sh exec pytest ...`, as
`make test` does), so pod IPs, Service IPs and the API server are reached as from a node. Containers
are containerd's: a pod's processes are its containers' tasks, killed the way the kernel's OOM killer
would (SIGKILL), and the kubelet restarts them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["BROKER_IMAGE", "CACHE", "DIR", "ROOT", "VERSION", "Cluster", "ClusterError", "ToolError",
           "condition", "ready"]

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TXBROKER_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
             / "txbroker")
DIR = Path(os.environ.get("TXBROKER_CLUSTER_DIR") or CACHE / "cluster")
VERSION = next(line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines()
               if line.startswith("version = "))
BROKER_IMAGE = f"txbroker/broker:{VERSION}"


class ClusterError(RuntimeError):
    pass


class ToolError(subprocess.CalledProcessError):
    """A kubectl/helm/ctr call failed; str() shows its stderr."""

    def __str__(self) -> str:
        return f"{' '.join(map(str, self.cmd))} exited {self.returncode}:\n{self.stderr}"


class Cluster:
    __test__ = False

    def __init__(self, directory: Path = DIR):
        self.dir = directory
        env_file = directory / "env"
        if not env_file.exists():
            raise ClusterError(f"no cluster is up ({env_file} is missing): `make test` brings one up; by hand, "
                               "`testbed/cluster.sh up`, then `testbed/cluster.sh exec .venv/bin/python -m pytest tests/e2e`")
        exports = dict(line.removeprefix("export ").split("=", 1) for line in env_file.read_text().splitlines()
                       if line.startswith("export "))
        self.kubeconfig = Path(exports["KUBECONFIG"])
        self.bin = Path(exports["PATH"].split(":")[0])
        self.sock = str(directory / "containerd.sock")

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for kubectl and helm against the cluster."""
        return dict(os.environ, KUBECONFIG=str(self.kubeconfig), PATH=f"{self.bin}:{os.environ['PATH']}",
                    HELM_CACHE_HOME=str(self.dir / "helm/cache"), HELM_CONFIG_HOME=str(self.dir / "helm/config"),
                    HELM_DATA_HOME=str(self.dir / "helm/data"), **extra)

    def run(self, tool: str, *args: str, input: str | None = None, check: bool = True,
            env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / tool) if (self.bin / tool).exists() else tool, *args]
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, env=env or self.env(), timeout=timeout)
        if check and r.returncode != 0:
            raise ToolError(r.returncode, cmd, r.stdout, r.stderr)
        return r

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.run("kubectl", *args, **kw)

    def helm(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.run("helm", *args, **kw)

    @contextlib.contextmanager
    def exclusive(self, what: str):
        """One pytest-xdist worker at a time in the block (the workers share the cluster): session
        setup that two workers doing at once would race on (CRDs, cached downloads)."""
        with open(self.dir / f"{what}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def check_reachable(self) -> None:
        r = self.kubectl("get", "--raw", "/readyz", check=False, timeout=15)
        if r.returncode != 0:
            raise ClusterError("the API server does not answer; the tests run inside the cluster's network "
                               "(`testbed/cluster.sh exec .venv/bin/python -m pytest tests/e2e`):\n" + r.stderr)

    # Reads go to the API server from this process, as kubectl's `get -o json` would answer them:
    # the tests poll these every half second while they wait, and a kubectl process per poll cost
    # about 0.15 CPU-s on a slow two-core host, beside the pods under test.
    @functools.cached_property
    def _api(self):
        from kubernetes import config
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def _request(self, path: str, **query: str) -> dict | None:
        """GET `path` as JSON; None when it is not found."""
        args = self._api.param_serialize("GET", path, query_params=list(query.items()), auth_settings=["BearerToken"])
        r = self._api.call_api(*args, _request_timeout=60)
        body = r.read()
        if r.status == 404:
            return None
        if r.status >= 300:
            raise ClusterError(f"GET {path} answered {r.status}: {body[:2000]!r}")
        return json.loads(body)

    def _discover(self) -> dict[str, tuple[str, str, bool]]:
        """kubectl's names for a resource (plural, singular, short names, Kind, lower-cased) ->
        (group-version path, plural, namespaced), from the API server's discovery."""
        names: dict[str, tuple[str, str, bool]] = {}
        versions = ["/api/v1"] + [f"/apis/{g['preferredVersion']['groupVersion']}"
                                  for g in self._request("/apis")["groups"]]
        for base in reversed(versions):   # the core group's names win, as in kubectl
            for r in (self._request(base) or {}).get("resources", []):
                if "/" in r["name"]:      # a subresource (pods/log)
                    continue
                entry = (base, r["name"], r["namespaced"])
                for alias in [r["name"], r.get("singularName") or "", r["kind"].lower(), *r.get("shortNames", [])]:
                    if alias:
                        names[alias] = entry
        return names

    def _resource(self, kind: str) -> tuple[str, str, bool]:
        names = self.__dict__.get("_names") or {}
        if kind.lower() not in names:   # not seen yet, or a CRD installed since
            names = self.__dict__["_names"] = self._discover()
        if kind.lower() not in names:
            raise ClusterError(f"the API server serves no resource called {kind!r}")
        return names[kind.lower()]

    def _path(self, kind: str, namespace: str | None, name: str | None = None) -> str:
        base, plural, namespaced = self._resource(kind)
        scope = f"/namespaces/{namespace or 'default'}" if namespaced else ""   # kubectl's default too
        return f"{base}{scope}/{plural}" + (f"/{name}" if name else "")

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        return self._request(self._path(kind, namespace, name))

    def list(self, kind: str, namespace: str, selector: str | None = None) -> list[dict]:
        found = self._request(self._path(kind, namespace), **({"labelSelector": selector} if selector else {}))
        if found is None:
            raise ClusterError(f"no {kind} in namespace {namespace} (the namespace is gone?)")
        return found["items"]

    def apply(self, manifest: dict | str, namespace: str | None = None) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", "-f", "-", *(["-n", namespace] if namespace else []), input=text)

    def create_namespace(self, name: str) -> str:
        r = self.kubectl("create", "namespace", name, check=False)
        if r.returncode != 0 and "AlreadyExists" not in r.stderr:
            raise ToolError(r.returncode, ["kubectl", "create", "namespace", name], r.stdout, r.stderr)
        return name

    def delete_namespace(self, name: str) -> None:
        """Start deleting a namespace, without waiting (its pods take their grace period)."""
        self.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")

    def logs(self, pod: str, namespace: str, container: str | None = None, previous: bool = False) -> str:
        args = ["logs", pod, "-n", namespace] + (["-c", container] if container else []) + (
            ["--previous"] if previous else [])
        return self.kubectl(*args).stdout

    def pod_log(self, name: str, namespace: str = "default", container: str | None = None) -> str:
        """What a pod's containers wrote (empty when it has none yet)."""
        r = self.kubectl("logs", name, "-n", namespace, *(["-c", container] if container else ["--all-containers"]),
                         check=False)
        return r.stdout

    def _running_containers(self, name: str, namespace: str) -> dict[str, str]:
        """container name -> containerd id, of a pod's running containers."""
        p = self.get("pod", name, namespace)
        return {s["name"]: s["containerID"].split("://", 1)[1]
                for s in (p or {}).get("status", {}).get("containerStatuses", [])
                if "running" in s.get("state", {}) and s.get("containerID")}

    def pod_pids(self, name: str, namespace: str = "default") -> dict[str, int]:
        """container name -> the pid of its task (its main process, as the node sees it): a restarted
        container, or a replaced pod, has another."""
        running = self._running_containers(name, namespace)
        tasks = {}
        for line in self.run("ctr", "-a", self.sock, "-n", "k8s.io", "tasks", "ls").stdout.splitlines()[1:]:
            task, pid, state = line.split()[:3]
            if state == "RUNNING":
                tasks[task] = int(pid)
        return {c: tasks[cid] for c, cid in running.items() if cid in tasks}

    def kill_pod(self, name: str, namespace: str = "default", sig: Any = "SIGKILL") -> list[str]:
        """Signal the main process of every running container of a pod (SIGKILL: a crash, as an OOM
        kill would be, which the kubelet answers with a restart; SIGSTOP/SIGCONT: a pause). Returns
        the containers' ids; LookupError when none runs."""
        running = self._running_containers(name, namespace)
        if not running:
            raise LookupError(f"no running container in pod {namespace}/{name}")
        for cid in running.values():
            r = self.run("ctr", "-a", self.sock, "-n", "k8s.io", "tasks", "kill", "--signal", getattr(sig, "name", sig),
                         cid, check=False)
            if r.returncode and "not found" in r.stderr:   # it ended before the kubelet's status said so
                raise LookupError(f"container {cid} of pod {namespace}/{name} is not running: {r.stderr.strip()}")
            if r.returncode:
                raise ToolError(r.returncode, r.args, r.stdout, r.stderr)
        return list(running.values())

    def exec(self, pod: str, namespace: str, *cmd: str, check: bool = False) -> subprocess.CompletedProcess:
        return self.kubectl("exec", pod, "-n", namespace, "--", *cmd, check=check)

    def events(self, namespace: str, name: str | None = None) -> list[dict]:
        items = self.list("events", namespace)
        return [e for e in items if name is None or e["involvedObject"]["name"] == name]


def ready(pod: dict | None) -> bool:
    return bool(pod) and any(c["type"] == "Ready" and c["status"] == "True"
                             for c in pod.get("status", {}).get("conditions", []))


def condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == kind), None)
