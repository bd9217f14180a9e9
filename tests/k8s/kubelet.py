"""A local kubelet for tests: runs the testbed's Pods as processes on this machine.

The testbed (tests/k8s/testbed.sh) has a real etcd, kube-apiserver and kube-controller-manager but no
scheduler, container runtime or kubelet. This program plays the node agent (and, for its own node, the
scheduler) against the real API server:

* registers a Node (Ready) and keeps its Ready condition fresh;
* binds every unscheduled Pod to that Node (there is no scheduler);
* runs each container's ``command`` + ``args`` as a local process (its own session, so its whole
  process group can be signalled), ``$(VAR)`` expanded as the kubelet does, with the container's
  ``env``/``envFrom``, including downward-API ``fieldRef``s (metadata.name, metadata.namespace,
  metadata.uid, metadata.labels['k'], metadata.annotations['k'], spec.nodeName,
  spec.serviceAccountName, status.podIP, status.hostIP), ``configMapKeyRef`` and ``secretKeyRef``;
  the executable is looked up on the kubelet's own PATH (tests put .venv/bin first, so an image's
  ``txbroker`` command is the project's CLI); init containers run to completion first;
* gives each Pod its own address as ``status.podIP``: 127.77.K.N (loopback), where K is a /24 this
  kubelet reserved (a lock file under ~/.cache/txbroker/run, so parallel testbeds - one per
  pytest-xdist worker - never share an address) and N is kept per pod name, so a Pod recreated
  under the same name gets the same address (127.0.0.0/8 is all loopback on Linux). The API server
  refuses loopback addresses in Endpoints and EndpointSlices, so Services get no endpoints for these
  pods; ``TXBROKER_POD_NET=A.B`` makes the addresses A.B.K.N instead, a range that must be local on
  this machine (as root, once: ``ip route add local A.B.0.0/16 dev lo``; 198.18.0.0/15 is reserved
  for benchmarking), and then Services get endpoints like on a real node;
* volumes: configMap, secret, downwardAPI (items with fieldRef), emptyDir and
  persistentVolumeClaim (by claim name; the claim object need not exist or be bound) become
  directories. emptyDir and PVC directories are keyed by pod name / claim name and survive a restart
  or re-creation of the pod. configMap, secret and downwardAPI volumes are written as Kubernetes'
  AtomicWriter writes them: the files in a timestamped directory ``..2026_11_21_12_00_00.123456789``,
  a symlink ``..data`` to it, and each top-level name a symlink ``key -> ..data/key``. They follow
  their source while the pod runs, as the real kubelet's volumes do (it resyncs about every minute;
  this one every ``TXBROKER_KUBELET_VOLUME_SYNC_SECONDS``, default 1 s): when the object's
  resourceVersion changed (downwardAPI: when the labels/annotations it shows did), the new content
  goes into a new timestamped directory, ``..data`` is swapped to it by a rename, the top-level
  symlinks follow (new keys added, removed keys gone) and the old directory is deleted - so a process
  reading a file by path sees the old or the new content, never a half-written file, and an mtime
  watcher (stat follows the symlinks) sees the change. If the object is deleted or loses a key an
  item needs, the volume keeps its last content. A ``subPath`` mount of such a volume is a copy taken
  at each container start and is not updated while the container runs (Kubernetes bind-mounts the
  file then);
* **mount paths**: processes run on the host, so a mount at /data cannot be honoured literally.
  Each mount's directory is at ``<state>/pods/<ns>/<pod>/volumes/<volume>`` (``subPath`` below it;
  for configMap/secret/downwardAPI the copy ``<pod>/volume-subpaths/<volume>/<container>/<i>/<name>``),
  and every occurrence of a ``mountPath`` as a path prefix in the command, args, env values and
  workingDir is replaced by that directory (``--data-dir /data`` runs as ``--data-dir
  <state>/pods/ns/pod/volumes/data``; longest mount path first; ``/data`` does not match
  ``/database``). Paths hidden inside files (a config file naming /data) are not rewritten;
* reports phase, podIP, conditions (PodScheduled, Initialized, ContainersReady, Ready) and
  containerStatuses (state, lastState, ready, started, restartCount) through the status
  subresource; readiness comes from the container's readinessProbe (httpGet, tcpSocket or exec,
  against podIP; initialDelaySeconds, periodSeconds, timeoutSeconds, successThreshold and
  failureThreshold honoured; ``scheme: HTTPS`` does not verify the certificate, as the kubelet's
  does not) or is true as soon as the process runs when there is no probe;
  livenessProbe failures restart the container;
* restarts exited containers per restartPolicy (Always, OnFailure, Never) with a short
  exponential back-off (0.5 s doubling to 8 s: shorter than the real 10 s-5 min, for tests);
* a Pod being deleted (deletionTimestamp set) gets SIGTERM, SIGKILL after its grace period (capped at
  10 s), and is then deleted with grace period 0, as the kubelet finalises a deletion;
* on SIGTERM/SIGINT stops every process it started and exits.

Not done: images (``image`` is recorded, never pulled), resource limits, ports/hostPort, Services
(no kube-proxy, no DNS: pods reach each other by pod IP), service-account token mounts, the
``KUBERNETES_SERVICE_*``/service env vars (only KUBERNETES_SERVICE_HOST/PORT of the API server are
set), projected volumes, startupProbe, ``kubectl logs``/``exec``/``port-forward`` (logs are in
``<state>/pods/<ns>/<pod>/logs/<container>.log``), ephemeral and sidecar containers.

Test helpers: :func:`kill_pod` (SIGKILL a pod's processes, as a crash or OOM kill would) and
:func:`pod_dir`. Run: ``python kubelet.py --kubeconfig K --state-dir D [--node-name N]``; or
``python kubelet.py kill --state-dir D NAMESPACE/NAME [--signal SIGTERM]``.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import json
import logging
import os
import queue
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger("kubelet")

RUN_DIR = Path(os.environ.get("TXBROKER_CACHE", Path.home() / ".cache" / "txbroker")) / "run"
POD_NET_PREFIX = os.environ.get("TXBROKER_POD_NET") or "127.77"   # A.B: pods get A.B.K.N (docstring)
BACKOFF_START, BACKOFF_MAX = 0.5, 8.0
MAX_GRACE = 10.0
# configMap/secret/downwardAPI volumes are brought up to date this often (the real kubelet: ~1 min)
VOLUME_SYNC_SECONDS = float(os.environ.get("TXBROKER_KUBELET_VOLUME_SYNC_SECONDS") or 1.0)
# Environment passed from the kubelet to every container (a container gets no other host variable).
HOST_ENV_PASS = re.compile(r"^(PATH|HOME|LANG|LC_\w+|TZ|TMPDIR|VIRTUAL_ENV|PYTHON\w*|COVERAGE\w*)$")


# --------------------------------------------------------------------------------------------
# helpers usable without a running kubelet (tests)
# --------------------------------------------------------------------------------------------

def pod_dir(state_dir: str | os.PathLike, namespace: str, name: str) -> Path:
    return Path(state_dir) / "pods" / namespace / name


def pod_pids(state_dir: str | os.PathLike, namespace: str, name: str) -> dict[str, int]:
    """Container name -> pid of the pod's running processes, as recorded by the kubelet."""
    pids = {}
    for f in (pod_dir(state_dir, namespace, name) / "containers").glob("*.pid"):
        try:
            pids[f.stem] = int(f.read_text())
        except (OSError, ValueError):
            continue
    return pids


def kill_pod(state_dir: str | os.PathLike, namespace: str, name: str,
             sig: int = signal.SIGKILL, container: str | None = None) -> list[int]:
    """Send `sig` to the process group of each of the pod's containers (or one container).

    Returns the pids signalled. Raises LookupError if the pod has no running process.
    """
    pids = pod_pids(state_dir, namespace, name)
    if container is not None:
        pids = {k: v for k, v in pids.items() if k == container}
    hit = []
    for pid in pids.values():
        try:
            os.killpg(pid, sig)
            hit.append(pid)
        except ProcessLookupError:
            continue
    if not hit:
        raise LookupError(f"pod {namespace}/{name} has no running process in {state_dir}")
    return hit


# --------------------------------------------------------------------------------------------
# pure helpers
# --------------------------------------------------------------------------------------------

def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: $(VAR) -> env[VAR] when defined, else left as is; $$ -> $."""
    out, i, n = [], 0, len(value)
    while i < n:
        c = value[i]
        if c == "$" and i + 1 < n:
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = value.find(")", i + 2)
                if end != -1:
                    name = value[i + 2:end]
                    out.append(env[name] if name in env else value[i:end + 1])
                    i = end + 1
                    continue
        out.append(c)
        i += 1
    return "".join(out)


def substitute_mounts(value: str, mounts: list[tuple[str, str]]) -> str:
    """Replace each mountPath used as a path prefix in `value` by its host directory.

    `mounts` is [(mountPath, hostDir)], longest mountPath first.
    """
    for mount_path, host in mounts:
        mp = mount_path.rstrip("/") or "/"
        pattern = r"(?<![\w.\-/])" + re.escape(mp) + r"(?=$|/|[^\w.\-])"
        value = re.sub(pattern, lambda _m, h=host: h, value)
    return value


def insecure_tls() -> ssl.SSLContext:
    """TLS without certificate checks: the kubelet's HTTPS probes trust whatever the pod serves."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# --------------------------------------------------------------------------------------------
# configMap/secret/downwardAPI volume contents: Kubernetes' AtomicWriter
# --------------------------------------------------------------------------------------------

DATA_LINK = "..data"


def read_payload(target: Path) -> dict[str, bytes] | None:
    """The files `atomic_write` put in `target` (relative path -> content); None when it wrote nothing."""
    data = target / DATA_LINK
    if not data.is_symlink():
        return None
    root = data.resolve()
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def new_timestamped_dir(target: Path) -> Path:
    """A new empty ``..2026_11_21_12_00_00.123456789`` (UTC, nanoseconds) in `target`, the kubelet's naming."""
    while True:
        ns = time.time_ns()
        stamp = datetime.fromtimestamp(ns // 10**9, timezone.utc).strftime("..%Y_%m_%d_%H_%M_%S")
        d = target / f"{stamp}.{ns % 10**9:09d}"
        try:
            d.mkdir()
            return d
        except FileExistsError:   # two writes within a nanosecond's resolution of the clock
            continue


def atomic_write(target: Path, files: dict[str, bytes]) -> bool:
    """Make `target` hold `files` (relative path -> content) the way Kubernetes' AtomicWriter does.

    The files go into a new timestamped directory; the symlink ``..data`` is swapped to it in one
    rename(2), so a process that opens ``target/key`` sees the old or the new content and never a
    half-written file; each top-level name is a symlink ``key -> ..data/key`` (added for new keys,
    removed for keys gone); the previous directory is deleted. Returns False, writing nothing, when
    `target` already holds exactly `files`: an mtime watcher then sees no change.
    """
    target.mkdir(parents=True, exist_ok=True)
    if read_payload(target) == files:
        return False
    data = target / DATA_LINK
    old = data.resolve() if data.is_symlink() else None
    ts = new_timestamped_dir(target)
    for rel, content in files.items():
        p = ts / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    tmp = target / (DATA_LINK + "_tmp")
    tmp.unlink(missing_ok=True)                 # left over if a previous swap was interrupted
    tmp.symlink_to(ts.name)                     # relative, like the kubelet's: the tree can move
    os.replace(tmp, data)                       # the swap: rename(2) replaces the link itself
    top = {rel.split("/", 1)[0] for rel in files}
    for name in top:
        if not (target / name).is_symlink():
            (target / name).symlink_to(Path(DATA_LINK) / name)
    for link in target.iterdir():
        if link.name not in top and not link.name.startswith("..") and link.is_symlink():
            link.unlink()                       # a key the object no longer has
    if old is not None and old != ts:
        shutil.rmtree(old, ignore_errors=True)
    return True


# --------------------------------------------------------------------------------------------
# the kubelet
# --------------------------------------------------------------------------------------------

class PodNet:
    """A /24 of local addresses (loopback by default) reserved by a lock file for this kubelet's lifetime."""

    def __init__(self, state_dir: Path):
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        self._lock_file = None
        for k in range(1, 255):
            f = open(RUN_DIR / f"podnet-{POD_NET_PREFIX}.{k}.lock", "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            f.write(f"{os.getpid()} {state_dir}\n")
            f.flush()
            self._lock_file, self.prefix = f, f"{POD_NET_PREFIX}.{k}"
            break
        else:
            raise RuntimeError(f"no free pod network under {POD_NET_PREFIX}.0.0/16")
        self._check_local(f"{self.prefix}.1")
        self._file = state_dir / "ips.json"
        self._ips: dict[str, str] = {}
        if self._file.exists():
            self._ips = {k: v for k, v in json.loads(self._file.read_text()).items()
                         if v.startswith(self.prefix + ".")}
        self._mu = threading.Lock()

    @staticmethod
    def _check_local(ip: str) -> None:
        """Fail now, not at the first pod, when the pod network is not an address range of this machine."""
        s = socket.socket()
        try:
            s.bind((ip, 0))
        except OSError as e:
            raise RuntimeError(f"pod network {POD_NET_PREFIX}.0.0/16 is not local on this machine ({e}); "
                               f"as root: ip route add local {POD_NET_PREFIX}.0.0/16 dev lo") from None
        finally:
            s.close()

    def ip_for(self, namespace: str, name: str) -> str:
        key = f"{namespace}/{name}"
        with self._mu:
            if key in self._ips:
                return self._ips[key]
            used = set(self._ips.values())
            for n in range(2, 255):
                ip = f"{self.prefix}.{n}"
                if ip not in used:
                    self._ips[key] = ip
                    self._file.write_text(json.dumps(self._ips))
                    return ip
        raise RuntimeError("pod network exhausted (253 pod names)")


@dataclass
class Probe:
    spec: dict
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0


@dataclass
class Container:
    spec: dict
    init: bool = False
    proc: subprocess.Popen | None = None
    log_file: Any = None
    restart_count: int = 0
    started_at: str | None = None
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict = field(default_factory=dict)
    ready: bool = False
    done: bool = False            # init container finished OK / regular container finished for good
    restart_at: float = 0.0
    backoff: float = BACKOFF_START
    readiness: Probe | None = None
    liveness: Probe | None = None
    mounts: list[tuple[str, str]] = field(default_factory=list)   # as of the last start (exec probes)

    @property
    def name(self) -> str:
        return self.spec["name"]


class PodWorker(threading.Thread):
    """Owns one pod (by uid): its processes, probes and status."""

    def __init__(self, kubelet: "Kubelet", pod: dict):
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.k = kubelet
        self.pod = pod
        self.ns, self.pod_name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = pod_dir(kubelet.state_dir, self.ns, self.pod_name)
        self.updates: queue.Queue = queue.Queue()
        self.stop_requested = threading.Event()
        self.ip = kubelet.podnet.ip_for(self.ns, self.pod_name)
        self.start_time = now_rfc3339()
        spec = pod["spec"]
        self.init_containers = [Container(c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [Container(c) for c in spec.get("containers") or []]
        self.last_key: str | None = None
        self.last_conditions: list[dict] = []
        self.error: str | None = None

    # -- plumbing ------------------------------------------------------------------------------

    def update(self, pod: dict) -> None:
        self.updates.put(pod)

    def stop(self) -> None:
        self.stop_requested.set()
        self.updates.put(None)

    def run(self) -> None:
        try:
            self._run()
        except Exception:  # noqa: BLE001 - a worker must never die silently
            log.exception("pod worker %s/%s crashed", self.ns, self.pod_name)
            self.kill_all(grace=0)

    def _run(self) -> None:
        self.prepare()
        while True:
            try:
                pod = self.updates.get(timeout=0.2)
                if pod is None:
                    break
                self.pod = pod
                while True:  # take only the newest
                    pod = self.updates.get_nowait()
                    if pod is None:
                        self.stop_requested.set()
                        break
                    self.pod = pod
            except queue.Empty:
                pass
            if self.stop_requested.is_set():
                break
            if self.pod["metadata"].get("deletionTimestamp"):
                grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
                self.kill_all(grace=min(float(grace if grace is not None else 30), MAX_GRACE))
                self.k.finalize_deletion(self.ns, self.pod_name, self.uid)
                return
            self.step()
            self.push_status()
        self.kill_all(grace=2)

    # -- setup ---------------------------------------------------------------------------------

    def prepare(self) -> None:
        for sub in ("volumes", "logs", "containers"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for f in (self.dir / "containers").glob("*.pid"):
            f.unlink()
        self.volumes: dict[str, Path] = {}
        self.volume_error: str | None = None
        # configMap/secret/downwardAPI volumes kept up to date: name -> version written (volume_payload)
        self.volume_versions: dict[str, str] = {}
        self.volume_sync_at = 0.0
        self.volume_sync_errors: dict[str, str] = {}

    def mount_volumes(self) -> bool:
        """Materialise the pod's volumes; on failure (say, a ConfigMap not created yet) retry later."""
        for vol in self.pod["spec"].get("volumes") or []:
            if vol["name"] in self.volumes:
                continue
            try:
                self.volumes[vol["name"]] = self.materialise(vol)
            except Exception as e:  # noqa: BLE001
                msg = f"MountVolume {vol['name']}: {e}"
                if msg != self.volume_error:
                    log.warning("%s/%s: %s", self.ns, self.pod_name, msg)
                self.volume_error = msg
                return False
        self.volume_error = None
        self.volume_sync_at = time.monotonic() + VOLUME_SYNC_SECONDS   # just read: no need to again
        return True

    def materialise(self, vol: dict) -> Path:
        name = vol["name"]
        if "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]["claimName"]
            d = self.k.state_dir / "pvc" / self.ns / claim
            d.mkdir(parents=True, exist_ok=True)
            return d
        d = self.dir / "volumes" / name
        if "emptyDir" in vol or "hostPath" in vol:
            d.mkdir(parents=True, exist_ok=True)
            return d
        version, files = self.volume_payload(vol)
        if d.exists():
            shutil.rmtree(d)   # a previous run's (nothing reads it now), maybe not even in this layout
        atomic_write(d, files)
        self.volume_versions[name] = version
        return d

    def volume_payload(self, vol: dict) -> tuple[str, dict[str, bytes]]:
        """(version, files) of a configMap, secret or downwardAPI volume; the version changes whenever
        the files may have: the object's resourceVersion, or for downwardAPI a digest of the files."""
        if "configMap" in vol or "secret" in vol:
            return self.config_payload(vol)
        if "downwardAPI" in vol:
            files = {it["path"]: self.field_ref(it["fieldRef"]["fieldPath"]).encode()
                     for it in vol["downwardAPI"].get("items") or [] if "fieldRef" in it}
            return hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest(), files
        raise ValueError(f"unsupported volume type: {sorted(set(vol) - {'name'})}")

    def config_payload(self, vol: dict) -> tuple[str, dict[str, bytes]]:
        is_cm = "configMap" in vol
        src = vol["configMap"] if is_cm else vol["secret"]
        obj_name = src.get("name") or src.get("secretName")
        obj = self.k.read_config(self.ns, obj_name, secret=not is_cm, optional=src.get("optional", False))
        data: dict[str, bytes] = {}
        if obj:
            for k, v in (obj.get("data") or {}).items():
                data[k] = base64.b64decode(v) if not is_cm else v.encode()
            for k, v in (obj.get("binaryData") or {}).items() if is_cm else ():
                data[k] = base64.b64decode(v)
            for k, v in (obj.get("stringData") or {}).items():
                data[k] = v.encode()
        version = obj["metadata"]["resourceVersion"] if obj else "absent"
        items = src.get("items")
        if not items:
            return version, data
        files = {}
        for it in items:
            if it["key"] in data:
                files[it["path"]] = data[it["key"]]
            elif not it.get("optional", src.get("optional", False)):
                raise LookupError(f"key {it['key']} not in {obj_name}")
        return version, files

    def sync_volumes(self) -> None:
        """Bring configMap/secret/downwardAPI volumes up to date, every VOLUME_SYNC_SECONDS: one GET per
        ConfigMap/Secret volume, and a write only when its resourceVersion moved."""
        t = time.monotonic()
        if t < self.volume_sync_at:
            return
        self.volume_sync_at = t + VOLUME_SYNC_SECONDS
        for vol in self.pod["spec"].get("volumes") or []:
            if vol["name"] in self.volume_versions:
                self.sync_volume(vol)

    def sync_volume(self, vol: dict) -> None:
        name = vol["name"]
        try:
            version, files = self.volume_payload(vol)
        except Exception as e:  # noqa: BLE001 - object deleted, key gone: keep the content, as the kubelet does
            msg = str(e)
            if self.volume_sync_errors.get(name) != msg:
                log.warning("%s/%s: volume %s not updated: %s", self.ns, self.pod_name, name, msg)
            self.volume_sync_errors[name] = msg
            return
        self.volume_sync_errors.pop(name, None)
        if version == self.volume_versions[name]:
            return
        if atomic_write(self.volumes[name], files):
            log.info("%s/%s: volume %s updated (version %s)", self.ns, self.pod_name, name, version[:16])
        self.volume_versions[name] = version

    # -- env, command ----------------------------------------------------------------------------

    def field_ref(self, path: str) -> str:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        simple = {
            "metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"], "spec.nodeName": self.k.node_name,
            "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
            "status.podIP": self.ip, "status.podIPs": self.ip, "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
        }
        if path in simple:
            return simple[path]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return (meta.get(m.group(1)) or {}).get(m.group(2), "")
        if path in ("metadata.labels", "metadata.annotations"):
            d = meta.get(path.split(".")[1]) or {}
            return "\n".join(f'{k}="{v}"' for k, v in sorted(d.items()))
        raise ValueError(f"unsupported fieldRef {path}")

    def container_env(self, c: Container) -> dict[str, str]:
        env = {k: v for k, v in self.k.host_env.items()}
        env["HOSTNAME"] = self.pod_name
        env.update(self.k.service_env)
        defined: dict[str, str] = {}   # what $(VAR) may refer to: the container's own variables
        for src in c.spec.get("envFrom") or []:
            prefix = src.get("prefix", "")
            ref = src.get("configMapRef") or src.get("secretRef")
            obj = self.k.read_config(self.ns, ref["name"], secret="secretRef" in src,
                                     optional=ref.get("optional", False))
            for k, v in ((obj or {}).get("data") or {}).items():
                defined[prefix + k] = base64.b64decode(v).decode() if "secretRef" in src else v
        for e in c.spec.get("env") or []:
            name = e["name"]
            if "value" in e:
                defined[name] = expand(e["value"], defined)
            elif "valueFrom" in e:
                vf = e["valueFrom"]
                if "fieldRef" in vf:
                    defined[name] = self.field_ref(vf["fieldRef"]["fieldPath"])
                elif "resourceFieldRef" in vf:
                    r = vf["resourceFieldRef"]["resource"]          # limits.cpu, requests.memory, ...
                    kind, res = r.split(".", 1)
                    val = ((c.spec.get("resources") or {}).get(kind) or {}).get(res)
                    defined[name] = str(val) if val is not None else ("2" if res == "cpu" else "0")
                elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
                    is_secret = "secretKeyRef" in vf
                    ref = vf["secretKeyRef"] if is_secret else vf["configMapKeyRef"]
                    obj = self.k.read_config(self.ns, ref["name"], secret=is_secret,
                                             optional=ref.get("optional", False))
                    raw = ((obj or {}).get("data") or {}).get(ref["key"])
                    if raw is None:
                        if ref.get("optional"):
                            continue
                        raise LookupError(f"env {name}: key {ref['key']} not in {ref['name']}")
                    defined[name] = base64.b64decode(raw).decode() if is_secret else raw
            else:
                defined[name] = ""
        env.update(defined)
        return env

    def mounts(self, c: Container) -> list[tuple[str, str]]:
        """[(mountPath, host path)] of a container about to start, longest mountPath first."""
        out = []
        for i, m in enumerate(c.spec.get("volumeMounts") or []):
            base = self.volumes.get(m["name"])
            if base is None:
                raise LookupError(f"volumeMount {m['name']}: no such volume (or it failed)")
            sub = m.get("subPath")
            if not sub:
                host = base
            elif m["name"] in self.volume_versions:
                host = self.pin_subpath(m["name"], c, i, base / sub)
            else:
                host = base / sub
                if not host.exists():
                    host.mkdir(parents=True)
            out.append((m["mountPath"], str(host)))
        out.sort(key=lambda t: len(t[0]), reverse=True)
        return out

    def pin_subpath(self, volume: str, c: Container, index: int, src: Path) -> Path:
        """A copy of `src` (in a configMap/secret/downwardAPI volume) for a subPath mount: Kubernetes
        bind-mounts the file as it is at container start, so volume updates do not reach it."""
        dest = self.dir / "volume-subpaths" / volume / c.name / str(index) / src.name
        if dest.parent.exists():
            shutil.rmtree(dest.parent)
        dest.parent.mkdir(parents=True)
        if src.is_dir():
            shutil.copytree(src, dest)
        elif src.exists():
            shutil.copyfile(src, dest)
        else:
            dest.mkdir()   # a subPath not in the volume: an empty directory, as the kubelet makes
        return dest

    def start_container(self, c: Container) -> None:
        spec = c.spec
        try:
            env = self.container_env(c)
            mounts = c.mounts = self.mounts(c)
            argv = [expand(a, env) for a in (spec.get("command") or [])]
            argv += [expand(a, env) for a in (spec.get("args") or [])]
            if not argv:
                raise ValueError("no command: the local kubelet cannot run an image's entrypoint")
            argv = [substitute_mounts(a, mounts) for a in argv]
            env = {k: substitute_mounts(v, mounts) for k, v in env.items()}
            exe = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", ""))
            if not exe:
                raise FileNotFoundError(f"executable {argv[0]!r} not found on PATH")
            cwd = substitute_mounts(spec.get("workingDir", ""), mounts) or str(self.dir)
            if c.log_file is None:
                c.log_file = open(self.dir / "logs" / f"{c.name}.log", "ab", buffering=0)
            c.log_file.write(f"--- {now_rfc3339()} start #{c.restart_count}: {argv}\n".encode())
            # setpriv: the process dies with this thread's process if the kubelet is SIGKILLed
            pre = ["setpriv", "--pdeathsig", "KILL", "--"] if self.k.setpriv else []
            c.proc = subprocess.Popen(pre + [exe] + argv[1:], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                      stdout=c.log_file, stderr=subprocess.STDOUT, start_new_session=True)
        except Exception as e:  # noqa: BLE001 - becomes the container's status, like a runtime error
            log.warning("%s/%s: cannot start %s: %s", self.ns, self.pod_name, c.name, e)
            c.state = {"waiting": {"reason": "CreateContainerError", "message": str(e)}}
            self.schedule_restart(c)
            return
        (self.dir / "containers" / f"{c.name}.pid").write_text(str(c.proc.pid))
        c.started_at = now_rfc3339()
        c.state = {"running": {"startedAt": c.started_at}}
        t = time.monotonic()
        c.readiness = Probe(spec["readinessProbe"]) if spec.get("readinessProbe") else None
        c.liveness = Probe(spec["livenessProbe"]) if spec.get("livenessProbe") else None
        for p in (c.readiness, c.liveness):
            if p:
                p.next_at = t + float(p.spec.get("initialDelaySeconds", 0))
        c.ready = not c.init and c.readiness is None
        log.info("%s/%s: started %s pid %s on %s", self.ns, self.pod_name, c.name, c.proc.pid, self.ip)

    def schedule_restart(self, c: Container) -> None:
        c.restart_at = time.monotonic() + c.backoff
        c.backoff = min(c.backoff * 2, BACKOFF_MAX)

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> None:
        if self.error:
            return
        if self.volume_error is not None or len(self.volumes) < len(self.pod["spec"].get("volumes") or []):
            if time.monotonic() < getattr(self, "_mount_retry_at", 0.0):
                return
            self._mount_retry_at = time.monotonic() + 1.0
            if not self.mount_volumes():
                for c in self.init_containers + self.containers:
                    c.state = {"waiting": {"reason": "ContainerCreating", "message": self.volume_error}}
                return
        self.sync_volumes()
        # init containers, one after another, each to a successful exit
        for c in self.init_containers:
            if c.done:
                continue
            self.drive(c)
            if not c.done:
                return
        for c in self.containers:
            self.drive(c)

    def drive(self, c: Container) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if c.init and policy == "Always":
            policy = "OnFailure"
        if c.proc is None:
            if c.done or time.monotonic() < c.restart_at:
                return
            self.start_container(c)
            return
        code = c.proc.poll()
        if code is None:
            self.probe(c)
            return
        # exited
        finished = now_rfc3339()
        term = {"exitCode": code if code >= 0 else 128 - code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": c.started_at, "finishedAt": finished}
        if code < 0:
            term["signal"] = -code
        c.proc = None
        (self.dir / "containers" / f"{c.name}.pid").unlink(missing_ok=True)
        c.ready = False
        log.info("%s/%s: %s exited %s", self.ns, self.pod_name, c.name, term["exitCode"])
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if restart:
            c.last_state = {"terminated": term}
            c.restart_count += 1
            c.state = {"waiting": {"reason": "CrashLoopBackOff",
                                   "message": f"back-off restarting failed container {c.name}"}}
            self.schedule_restart(c)
        else:
            c.state = {"terminated": term}
            c.done = code == 0 or not c.init
            if c.init and code != 0:
                self.error = f"init container {c.name} failed with exit code {code}"

    def probe(self, c: Container) -> None:
        t = time.monotonic()
        for kind in ("readiness", "liveness"):
            p: Probe | None = getattr(c, kind)
            if p is None or t < p.next_at:
                continue
            p.next_at = t + float(p.spec.get("periodSeconds", 10))
            ok = self.run_probe(p.spec, c)
            if ok:
                p.successes, p.failures = p.successes + 1, 0
            else:
                p.successes, p.failures = 0, p.failures + 1
            if kind == "readiness":
                if ok and p.successes >= int(p.spec.get("successThreshold", 1)):
                    c.ready = True
                elif not ok and p.failures >= int(p.spec.get("failureThreshold", 3)):
                    c.ready = False
            elif not ok and p.failures >= int(p.spec.get("failureThreshold", 3)):
                log.info("%s/%s: %s failed its liveness probe, restarting", self.ns, self.pod_name, c.name)
                self.kill(c, grace=float(self.pod["spec"].get("terminationGracePeriodSeconds", 30)))

    def run_probe(self, spec: dict, c: Container) -> bool:
        timeout = float(spec.get("timeoutSeconds", 1))
        try:
            if "httpGet" in spec:
                h = spec["httpGet"]
                port = self.port(h["port"], c)
                host = h.get("host") or self.ip
                scheme = h.get("scheme", "HTTP").lower()
                url = f"{scheme}://{host}:{port}{h.get('path', '/')}"
                req = urllib.request.Request(url, headers={x["name"]: x["value"] for x in h.get("httpHeaders") or []})
                ctx = insecure_tls() if scheme == "https" else None   # the kubelet does not verify either
                with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
                    return 200 <= r.status < 400
            if "tcpSocket" in spec:
                s = spec["tcpSocket"]
                with socket.create_connection((s.get("host") or self.ip, self.port(s["port"], c)), timeout=timeout):
                    return True
            if "exec" in spec:
                env = self.container_env(c)
                mounts = c.mounts   # not self.mounts(c): that would take new subPath copies
                argv = [substitute_mounts(expand(a, env), mounts) for a in spec["exec"]["command"]]
                return subprocess.run(argv, env=env, timeout=timeout, capture_output=True).returncode == 0
        except (OSError, urllib.error.URLError, subprocess.TimeoutExpired, ValueError):
            return False
        return False

    @staticmethod
    def port(p: int | str, c: Container) -> int:
        if isinstance(p, int) or str(p).isdigit():
            return int(p)
        for cp in c.spec.get("ports") or []:
            if cp.get("name") == p:
                return int(cp["containerPort"])
        raise ValueError(f"no container port named {p}")

    def kill(self, c: Container, grace: float) -> None:
        proc = c.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=max(grace, 0.0))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def kill_all(self, grace: float) -> None:
        for c in self.init_containers + self.containers:
            self.kill(c, grace)
            if c.proc is not None:
                (self.dir / "containers" / f"{c.name}.pid").unlink(missing_ok=True)
            if c.log_file is not None:
                c.log_file.close()
                c.log_file = None

    # -- status --------------------------------------------------------------------------------

    def container_status(self, c: Container) -> dict:
        return {
            "name": c.name, "image": c.spec.get("image", ""), "imageID": "",
            "containerID": f"local://{c.proc.pid}" if c.proc else "",
            "ready": c.ready, "started": c.proc is not None, "restartCount": c.restart_count,
            "state": c.state, "lastState": c.last_state,
        }

    def push_status(self) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        inits_done = all(c.done for c in self.init_containers)
        running = [c for c in self.containers if c.proc is not None]
        terminated = [c for c in self.containers if "terminated" in c.state]
        if self.error:
            phase = "Failed"
        elif not inits_done or not (running or any(c.restart_count for c in self.containers) or terminated):
            phase = "Pending"
        elif policy != "Always" and self.containers and all(c.done or "terminated" in c.state for c in self.containers) \
                and not running:
            phase = "Succeeded" if all(c.state["terminated"]["exitCode"] == 0 for c in self.containers) else "Failed"
        else:
            phase = "Running"
        ready = bool(self.containers) and all(c.ready for c in self.containers) and phase == "Running"
        ts = now_rfc3339()

        def cond(t: str, ok: bool, reason: str | None = None) -> dict:
            d = {"type": t, "status": "True" if ok else "False"}
            if reason and not ok:
                d["reason"] = reason
            return d
        conditions = [
            cond("PodScheduled", True), cond("Initialized", inits_done, "ContainersNotInitialized"),
            cond("ContainersReady", ready, "ContainersNotReady"), cond("Ready", ready, "ContainersNotReady"),
        ]
        status = {
            "phase": phase, "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip, "podIPs": [{"ip": self.ip}], "startTime": self.start_time,
            "conditions": conditions,
            "initContainerStatuses": [self.container_status(c) for c in self.init_containers] or None,
            "containerStatuses": [self.container_status(c) for c in self.containers],
        }
        if self.error:
            status["message"], status["reason"] = self.error, "LocalKubeletError"
        key = json.dumps(status, sort_keys=True)   # "did anything change", before timestamps
        if key == self.last_key:
            return
        # lastTransitionTime: kept while a condition's status does not change
        old = {c["type"]: c for c in self.last_conditions}
        for c in conditions:
            o = old.get(c["type"])
            c["lastTransitionTime"] = o["lastTransitionTime"] if o and o["status"] == c["status"] else ts
        if self.k.patch_pod_status(self.ns, self.pod_name, self.uid, status):
            self.last_key, self.last_conditions = key, conditions


class Rest:
    """Minimal JSON REST client for the testbed's kubeconfig (client certificate or token)."""

    def __init__(self, kubeconfig: str):
        from kubernetes import client, config   # only the config loader: no generated models

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.cfg, self.host = cfg, cfg.host.rstrip("/")
        import ssl

        import urllib3
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        self.pool = urllib3.PoolManager(num_pools=2, maxsize=16, ssl_context=ctx)
        self.urllib3 = urllib3

    def _headers(self, content_type: str = "application/json") -> dict:
        h = {"Accept": "application/json", "Content-Type": content_type}
        auth = self.cfg.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            h["Authorization"] = auth["value"]
        return h

    def request(self, method: str, path: str, body: Any = None, *, query: dict | None = None,
                content_type: str = "application/json") -> tuple[int, Any]:
        from urllib.parse import urlencode

        url = self.host + path + ("?" + urlencode(query) if query else "")
        r = self.pool.request(method, url, body=json.dumps(body).encode() if body is not None else None,
                              headers=self._headers(content_type), timeout=30, retries=False)
        try:
            return r.status, (json.loads(r.data) if r.data else None)
        except ValueError:
            return r.status, {"message": r.data.decode(errors="replace")}

    def watch(self, path: str, resource_version: str, timeout_seconds: int = 60, query: dict | None = None):
        """Yield watch events ({type, object}) from `resource_version` until the server ends the stream."""
        from urllib.parse import urlencode

        q = urlencode({**(query or {}), "watch": "1", "resourceVersion": resource_version,
                       "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)})
        r = self.pool.request("GET", f"{self.host}{path}?{q}", headers=self._headers(), preload_content=False,
                              timeout=self.urllib3.Timeout(connect=5, read=timeout_seconds + 30), retries=False)
        try:
            if r.status != 200:
                raise RuntimeError(f"watch {path}: HTTP {r.status}")
            buf = b""
            for chunk in r.stream(65536, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            r.release_conn()


class Kubelet:
    def __init__(self, kubeconfig: str, state_dir: Path, node_name: str):
        self.state_dir = state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.node_name = node_name
        self.rest = Rest(kubeconfig)
        self.podnet = PodNet(state_dir)
        self.workers: dict[str, PodWorker] = {}
        self.stopping = threading.Event()
        self.host_env = {k: v for k, v in os.environ.items() if HOST_ENV_PASS.match(k)}
        m = re.match(r"https?://([^:/]+):(\d+)", self.rest.host)   # https://127.0.0.1:PORT
        self.service_env = {"KUBERNETES_SERVICE_HOST": m.group(1), "KUBERNETES_SERVICE_PORT": m.group(2)} if m else {}
        self.setpriv = shutil.which("setpriv") is not None

    # -- API helpers ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
              query: dict | None = None) -> tuple[int, Any]:
        try:
            return self.rest.request(method, path, body, query=query, content_type=content_type)
        except OSError as e:   # connection trouble: report like a server error
            return 599, {"message": str(e)}

    def read_config(self, ns: str, name: str, secret: bool, optional: bool = False) -> dict | None:
        kind = "secrets" if secret else "configmaps"
        st, obj = self._call("GET", f"/api/v1/namespaces/{ns}/{kind}/{name}")
        if st == 200:
            return obj
        if st == 404 and optional:
            return None
        raise LookupError(f"{kind[:-1]} {ns}/{name}: HTTP {st}")

    def patch_pod_status(self, ns: str, name: str, uid: str, status: dict) -> bool:
        body = {"metadata": {"uid": uid}, "status": status}
        st, obj = self._call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", body,
                             "application/strategic-merge-patch+json")
        if st != 200:
            log.warning("status of %s/%s: HTTP %s %s", ns, name, st, (obj or {}).get("message"))
        return st == 200

    def finalize_deletion(self, ns: str, name: str, uid: str) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        st, obj = self._call("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", body)
        log.info("%s/%s: deleted (HTTP %s)", ns, name, st)

    def bind(self, pod: dict) -> None:
        meta = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name}}
        st, obj = self._call("POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", body)
        if st not in (200, 201, 409):
            log.warning("binding %s/%s: HTTP %s %s", meta["namespace"], meta["name"], st, (obj or {}).get("message"))

    # -- node ----------------------------------------------------------------------------------

    def node_status(self) -> dict:
        ts = now_rfc3339()
        cap = {"cpu": str(os.cpu_count() or 1), "memory": "16Gi", "pods": "250", "ephemeral-storage": "100Gi"}

        def c(t, s, reason, msg):
            return {"type": t, "status": s, "reason": reason, "message": msg,
                    "lastHeartbeatTime": ts, "lastTransitionTime": self._node_since}
        return {
            "capacity": cap, "allocatable": cap,
            "conditions": [
                c("Ready", "True", "KubeletReady", "local test kubelet is posting ready status"),
                c("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                c("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                c("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": self.node_name}],
            "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": os.uname().release,
                         "osImage": "local", "containerRuntimeVersion": "local://processes",
                         "kubeletVersion": "v0.0.0-local", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
        }

    def register_node(self) -> None:
        self._node_since = now_rfc3339()
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node_name,
                             "labels": {"kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux",
                                        "kubernetes.io/arch": "amd64", "txbroker.dev/local-kubelet": "true"}},
                "spec": {"podCIDR": f"{self.podnet.prefix}.0/24"}}
        st, obj = self._call("POST", "/api/v1/nodes", body)
        if st not in (201, 409):
            raise RuntimeError(f"cannot register node {self.node_name}: HTTP {st} {obj}")
        self.heartbeat()

    def heartbeat(self) -> None:
        st, obj = self._call("PATCH", f"/api/v1/nodes/{self.node_name}/status",
                             {"status": self.node_status()}, "application/strategic-merge-patch+json")
        if st != 200:
            log.warning("node heartbeat: HTTP %s %s", st, (obj or {}).get("message"))

    def heartbeat_loop(self) -> None:
        while not self.stopping.wait(10):
            self.heartbeat()

    # -- pods ----------------------------------------------------------------------------------

    def handle(self, etype: str, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        node = spec.get("nodeName")
        if etype == "DELETED":
            w = self.workers.pop(uid, None)
            if w:
                w.stop()
            return
        if not node:
            if not meta.get("deletionTimestamp"):
                self.bind(pod)
            return
        if node != self.node_name:
            return
        w = self.workers.get(uid)
        if w is None:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") and not meta.get("deletionTimestamp"):
                return   # finished before this kubelet started
            w = PodWorker(self, pod)
            self.workers[uid] = w
            w.start()
        else:
            w.update(pod)

    def watch_loop(self) -> None:
        while not self.stopping.is_set():
            st, lst = self._call("GET", "/api/v1/pods")
            if st != 200:
                log.warning("listing pods: HTTP %s", st)
                self.stopping.wait(1)
                continue
            seen = set()
            for pod in lst.get("items") or []:
                seen.add(pod["metadata"]["uid"])
                self.handle("ADDED", pod)
            for uid in list(self.workers):
                if uid not in seen:
                    self.handle("DELETED", {"metadata": {"uid": uid}, "spec": {}})
            self.ready_file.touch()
            rv = lst["metadata"]["resourceVersion"]
            try:
                for ev in self.rest.watch("/api/v1/pods", rv, timeout_seconds=60):
                    if self.stopping.is_set():
                        break
                    if ev["type"] == "ERROR":
                        break    # 410 Gone and friends: relist
                    if ev["type"] == "BOOKMARK":
                        continue
                    self.handle(ev["type"], ev["object"])
            except Exception as e:  # noqa: BLE001 - reconnect on any watch failure
                if not self.stopping.is_set():
                    log.info("pod watch ended (%s); relisting", e)
                    self.stopping.wait(0.5)

    def run(self) -> None:
        self.ready_file = self.state_dir / "ready"
        self.ready_file.unlink(missing_ok=True)
        self.register_node()
        threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True).start()
        t = threading.Thread(target=self.watch_loop, name="watch", daemon=True)
        t.start()
        log.info("node %s ready; pod network %s.0/24", self.node_name, self.podnet.prefix)
        self.stopping.wait()
        self.shutdown()

    def shutdown(self) -> None:
        workers = list(self.workers.values())
        for w in workers:
            w.stop()
        for w in workers:
            w.join(timeout=MAX_GRACE + 5)
        log.info("kubelet stopped")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    k = sub.add_parser("kill", help="signal a pod's processes")
    k.add_argument("--state-dir", required=True)
    k.add_argument("--signal", default="SIGKILL")
    k.add_argument("pod", help="NAMESPACE/NAME")
    ap.add_argument("--kubeconfig")
    ap.add_argument("--state-dir")
    ap.add_argument("--node-name", default="testbed-node")
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log_level, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    if a.cmd == "kill":
        ns, _, name = a.pod.rpartition("/")
        print(kill_pod(a.state_dir, ns or "default", name, getattr(signal, a.signal)))
        return 0
    if not (a.kubeconfig and a.state_dir):
        ap.error("--kubeconfig and --state-dir are required")
    kl = Kubelet(a.kubeconfig, Path(a.state_dir).resolve(), a.node_name)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: kl.stopping.set())
    kl.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
