"""What one schedule runs on the node, deployed as a user deploys it: a namespace of its own holding
the chart's operator (two replicas electing a leader through a Lease, watching only this
namespace), a TxBroker of two broker groups of three brokers (SYNC replication and flush, a PVC per
broker, a 3 s failover grace) and the workload pod (chaos/k8s/pod.py: chaos/workload.py and
chaos/reader.py, mounted from a ConfigMap into a pod of the broker image).

The testbed handle is the e2e tests' (tests/e2e/cluster.py: kubectl, helm, ctr against the
cluster testbed/cluster.sh runs); frequent reads (pods, the TxBroker, the Lease) go through the
Kubernetes Python client instead of a kubectl process each, to spare the machine's two cores.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client as k8s, config as k8s_config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "txbroker"
NAME = "txb"  # the TxBroker
WORKLOAD = "chaos-workload"  # the workload pod
WORKLOAD_PORT = 8080
GROUPS, REPLICAS = 2, 3
GRACE_S = 3
# shipped to the workload pod: the package's files it imports, by ConfigMap key -> path under /chaos-src
POD_FILES = {"chaos.init.py": "chaos/__init__.py", "chaos.workload.py": "chaos/workload.py",
             "chaos.reader.py": "chaos/reader.py", "chaos.k8s.init.py": "chaos/k8s/__init__.py",
             "chaos.k8s.pod.py": "chaos/k8s/pod.py", "chaos.k8s.record.py": "chaos/k8s/record.py"}


def _load_testbed_module():
    """tests/e2e/cluster.py, the e2e tests' handle on the testbed (tests/ is no package)."""
    spec = importlib.util.spec_from_file_location("txbroker_e2e_cluster", ROOT / "tests" / "e2e" / "cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


testbed_module = _load_testbed_module()
Cluster, ClusterError, ToolError = testbed_module.Cluster, testbed_module.ClusterError, testbed_module.ToolError
VERSION, ready, DIR = testbed_module.VERSION, testbed_module.ready, testbed_module.DIR


class Api:
    """Reads through the Kubernetes Python client, as plain dicts."""

    def __init__(self, tb: Any):
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(tb.kubeconfig), client_configuration=cfg)
        self.client = k8s.ApiClient(cfg)
        self.core = k8s.CoreV1Api(self.client)
        self.custom = k8s.CustomObjectsApi(self.client)
        self.coordination = k8s.CoordinationV1Api(self.client)

    def _dict(self, obj) -> dict:
        return self.client.sanitize_for_serialization(obj)

    def pods(self, namespace: str, selector: str = "") -> list[dict]:
        return self._dict(self.core.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=10))["items"]

    def pod(self, namespace: str, name: str) -> dict | None:
        try:
            return self._dict(self.core.read_namespaced_pod(name, namespace, _request_timeout=10))
        except k8s.ApiException as e:
            if e.status == 404:
                return None
            raise

    def txbroker(self, namespace: str, name: str = NAME) -> dict:
        return self.custom.get_namespaced_custom_object("txbroker.dev", "v1alpha1", namespace, "txbrokers", name,
                                                        _request_timeout=10)

    def leases(self, namespace: str) -> list[dict]:
        return self._dict(self.coordination.list_namespaced_lease(namespace, _request_timeout=10))["items"]

    def events(self, namespace: str) -> list[dict]:
        return self._dict(self.core.list_namespaced_event(namespace, _request_timeout=10))["items"]


class ClusterGone(RuntimeError):
    """The cluster this process runs in was taken down (someone's `testbed/cluster.sh up` or `down`)."""


NETNS_PATH = Path("/var/run/netns") / os.environ.get("TXBROKER_NETNS", "txb-node")


def check_cluster() -> None:
    """Raise ClusterGone when this process's network namespace is no longer the cluster's."""
    try:
        if os.stat("/proc/self/ns/net").st_ino == os.stat(NETNS_PATH).st_ino:
            return
    except FileNotFoundError:
        pass
    raise ClusterGone(f"the cluster's network namespace {NETNS_PATH} is gone or another: the cluster was restarted")


def wait(what: str, timeout: float, probe, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        check_cluster()
        try:
            got = probe()
        except Exception as e:  # noqa: BLE001 - an API hiccup while the node is loaded: try again
            last = e
            got = None
        if got:
            return got
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last})" if last else ""))


def txbroker_manifest(storage: bool, tag: str = VERSION) -> dict:
    spec: dict[str, Any] = {
        "image": f"txbroker/broker:{tag}", "replicas": REPLICAS, "groups": GROUPS, "replication": "SYNC", "flush": "SYNC",
        "failover": {"gracePeriodSeconds": GRACE_S},
        # check-back soon after a transaction is left undecided, as the local harness does (1 s is the CRD's least)
        "transaction": {"checkIntervalSeconds": 1, "timeoutSeconds": 1},
        # the node has two cores: the default requests (250m each) would not let six brokers in
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
    }
    if storage:  # a force-deleted pod's replacement finds its data again, as with a StatefulSet's claims
        spec["storage"] = {"size": "512Mi"}
    return {"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxBroker", "metadata": {"name": NAME}, "spec": spec}


def workload_pod(seed: int, namespace: str, tag: str = VERSION, checks_as_workload: bool = False) -> dict:
    bootstrap = f"{NAME}-master.{namespace}.svc.cluster.local:10911"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": WORKLOAD, "labels": {"app": WORKLOAD}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{
                         "name": "main", "image": f"txbroker/broker:{tag}", "imagePullPolicy": "IfNotPresent",
                         "command": ["python", "-m", "chaos.k8s.pod", "--seed", str(seed), "--bootstrap", bootstrap,
                                     "--port", str(WORKLOAD_PORT),
                                     *(["--checks-as-workload"] if checks_as_workload else [])],
                         "env": [{"name": "PYTHONPATH", "value": "/chaos-src"},
                                 {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                         "ports": [{"name": "control", "containerPort": WORKLOAD_PORT}],
                         "readinessProbe": {"httpGet": {"path": "/status", "port": WORKLOAD_PORT}, "periodSeconds": 2},
                         "volumeMounts": [{"name": "src", "mountPath": "/chaos-src", "readOnly": True},
                                          {"name": "route", "mountPath": "/etc/txbroker-route", "readOnly": True}]}],
                     "volumes": [{"name": "src", "configMap": {"name": "chaos-src", "items": [
                                     {"key": k, "path": p} for k, p in POD_FILES.items()]}},
                                 {"name": "route", "configMap": {"name": f"{NAME}-route"}}]}}


class Deployment:
    """One schedule's namespace and what runs in it."""

    def __init__(self, tb: Any, api: Api, seed: int, storage: bool = True, tag: str = VERSION,
                 checks_as_workload: bool = False):
        """`tag`: the images' (txbroker/broker and txbroker/operator, as testbed/cluster.sh loads
        them; the project's version by default)."""
        self.tb, self.api, self.seed, self.storage, self.tag = tb, api, seed, storage, tag
        self.checks_as_workload = checks_as_workload
        suffix = uuid.uuid4().hex[:5]
        self.namespace = f"chaos-k8s-{seed}-{suffix}"
        # the chart's release (the operator), in the schedule's namespace; its name is unique as the
        # chart's ClusterRole (reading CRDs and namespaces) is named after it
        self.release = f"chaos-{seed}-{suffix}"
        self.deployment = f"{self.release}-txbroker-operator"
        self.lease = f"{self.deployment}-leader"

    # ---- up ----------------------------------------------------------------------------------

    def up(self) -> None:
        tb, ns = self.tb, self.namespace
        tb.kubectl("apply", "-f", str(ROOT / "crds"))
        tb.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                   "crd/txbrokers.txbroker.dev", "crd/txproducergroups.txbroker.dev")
        tb.create_namespace(ns)
        wait(f"namespace {ns}'s default ServiceAccount", 60, lambda: tb.get("serviceaccount", "default", ns))
        tb.helm("upgrade", "--install", self.release, str(CHART), "-n", ns,
                "--set", f"operator.watchNamespaces={{{ns}}}", "--set", f"operator.image.tag={self.tag}",
                "--set", "operator.resyncSeconds=2", timeout=180)
        wait("both operator replicas Ready and one holding the Lease", 240, lambda: len(
            [p for p in self.operator_pods() if ready(p)]) == 2 and self.leader())
        tb.apply(txbroker_manifest(self.storage, self.tag), ns)
        wait(f"TxBroker {NAME} Running with {GROUPS} groups of {REPLICAS}", 420, self._running, interval=2)
        tb.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chaos-src"},
                  "data": {k: (ROOT / p).read_text() for k, p in POD_FILES.items()}}, ns)
        tb.apply(workload_pod(self.seed, ns, self.tag, self.checks_as_workload), ns)
        wait("the workload pod Ready", 180, lambda: ready(self.api.pod(ns, WORKLOAD)))

    def _running(self) -> bool:
        st = self.api.txbroker(self.namespace).get("status") or {}
        return st.get("phase") == "Running" and len(st.get("groups") or []) == GROUPS and all(
            g.get("readyBrokers") == REPLICAS for g in st["groups"])

    # ---- what runs ---------------------------------------------------------------------------

    def operator_pods(self) -> list[dict]:
        return [p for p in self.api.pods(self.namespace, f"app.kubernetes.io/instance={self.release}")
                if not p["metadata"].get("deletionTimestamp")]

    def leader(self) -> str:
        """The operator pod holding the Lease (its identity is the pod name plus a suffix)."""
        for lease in self.api.leases(self.namespace):
            if lease["metadata"]["name"] == self.lease:
                holder = (lease.get("spec") or {}).get("holderIdentity") or ""
                return holder.rsplit("_", 1)[0]
        return ""

    def broker_pods(self) -> list[dict]:
        return self.api.pods(self.namespace, f"txbroker.dev/broker={NAME}")

    def status(self) -> dict:
        return self.api.txbroker(self.namespace).get("status") or {}

    def groups(self) -> dict[str, dict]:
        """Each group's block of the TxBroker's status (master, epoch, masterUnavailableSince)."""
        return {g["name"]: g for g in self.status().get("groups") or []}

    def members(self, group: str) -> list[str]:
        return [f"{NAME}-{i}" if group == "g0" else f"{NAME}-{group}-{i}" for i in range(REPLICAS)]

    # ---- the workload pod ----------------------------------------------------------------------

    def workload_url(self, path: str) -> str:
        ip = self.api.pod(self.namespace, WORKLOAD)["status"]["podIP"]
        return f"http://{ip}:{WORKLOAD_PORT}{path}"

    def workload(self, path: str, post: bool = False, timeout: float = 10) -> Any:
        req = urllib.request.Request(self.workload_url(path), method="POST" if post else "GET", data=b"" if post else None)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
        return json.loads(gzip.decompress(body)) if path == "/history" else json.loads(body)

    # ---- after ---------------------------------------------------------------------------------

    def collect_state(self, out: Path, prefix: str) -> None:
        """The TxBroker, the pods, the Lease and the Events as the API server holds them (the pods'
        logs are copied off the node as they grow: watch.py)."""
        for what in ("txb", "events", "pods", "leases"):
            r = self.tb.kubectl("get", what, "-n", self.namespace, "-o", "yaml", check=False, timeout=60)
            (out / f"{prefix}-{what}.yaml").write_text(r.stdout + r.stderr)

    def down(self) -> None:
        """The namespace goes, everything in it with it (the PVCs too; the provisioner removes their
        directories). Not waited for."""
        self.tb.helm("uninstall", self.release, "-n", self.namespace, check=False, timeout=120)
        self.tb.delete_namespace(self.namespace)
