"""The operator under test and helpers for TxBrokers on the cluster (tests/e2e/test_k8s_operator.py,
test_k8s_security.py, test_k8s_user_path.py).

The operator runs as a user runs it: the chart installed with the operator image built from
operator/Dockerfile, its pod under the chart's ServiceAccount and RBAC. Each test module (or test)
gets its own release watching only its own namespace (`operator.watchNamespaces`, a Role there), so
operators never share a TxBroker and the chart's least-privilege rules are exercised. Brokers run
the image built from broker_image/Dockerfile.
"""

from __future__ import annotations

import json
import re
import uuid
import urllib.request

from cluster import BROKER_IMAGE, DIR, ROOT, VERSION, condition, ready
from support.waiting import wait_until

from txbroker.client.admin import AdminClient

from support.refusals import end_transaction_refusal

__all__ = ["CHART", "IMAGE", "OPERATOR_NAMESPACE", "InClusterOperator", "addresses", "admin", "broker_info",
           "brokers_report", "condition", "consumer_pod", "end_transaction_refusal", "events_for", "finished", "healthz",
           "read_topic", "ready", "service_endpoints", "start_operator", "txbroker", "wait_broker", "wait_rolled"]

CHART = str(ROOT / "helm" / "txbroker")
IMAGE = BROKER_IMAGE
OPERATOR_NAMESPACE = "txbroker-system"


def healthz(ip: str, path: str = "/healthz") -> int:
    with urllib.request.urlopen(f"http://{ip}:10912{path}", timeout=2) as r:
        return r.status


def start_operator(crds, namespace: str, resync_seconds: int = 1):
    """Generator for a fixture: the chart installed as release `op-<namespace>`, its operator pod
    watching `namespace`-<random> (created here; a run right after another need not wait for the
    last one's namespace to go); yields an InClusterOperator. At the end: uninstalled, and the
    operator must not have hit an RBAC denial."""
    namespace = f"{namespace}-{uuid.uuid4().hex[:5]}"
    op = InClusterOperator(crds, namespace, resync_seconds)
    yield op
    text = op.log.read_text()
    op.uninstall()
    crds.delete_namespace(namespace)
    denied = [line for line in text.splitlines() if re.search(r'Forbidden|HTTP 403|HTTP/1\.1" 403', line)]
    assert not denied, "the operator hit RBAC denials:\n" + "\n".join(denied[:5])


class _Log:
    """The operator's log, as `kubectl logs` gives it (the current container and the one before it
    restarted), with the read_text() of a file."""

    def __init__(self, op: "InClusterOperator"):
        self.op = op

    def read_text(self, errors: str = "replace") -> str:
        tb, ns = self.op.testbed, OPERATOR_NAMESPACE
        out = []
        for pod in tb.list("pods", ns, f"app.kubernetes.io/instance={self.op.release}"):
            name = pod["metadata"]["name"]
            out += [tb.kubectl("logs", name, "-n", ns, "--previous", check=False).stdout,
                    tb.kubectl("logs", name, "-n", ns, check=False).stdout]
        return "".join(out)


class InClusterOperator:
    """The operator as the chart deploys it, watching one namespace; can be stopped (its Deployment
    scaled to 0 and its pod gone, as when its node is lost) and started again."""

    def __init__(self, testbed, namespace: str, resync_seconds: int):
        self.testbed, self.namespace = testbed, testbed.create_namespace(namespace)
        testbed.create_namespace(OPERATOR_NAMESPACE)
        self.release = f"op-{namespace}"[:53]
        self.deployment = f"{self.release}-txbroker-operator"
        self.log = _Log(self)
        testbed.helm("upgrade", "--install", self.release, CHART, "-n", OPERATOR_NAMESPACE,
                     "--set", f"operator.watchNamespaces={{{namespace}}}", "--set", f"operator.image.tag={VERSION}",
                     "--set", f"operator.resyncSeconds={resync_seconds}", "--set", "operator.logLevel=verbose")
        self.wait_ready()

    def wait_ready(self, timeout: float = 120) -> None:
        try:
            wait_until(lambda: self.pods() and all(ready(p) for p in self.pods()), timeout, f"{self.deployment} Ready")
        except TimeoutError as e:
            raise AssertionError(f"{e}; its log:\n{self.log.read_text()[-3000:]}") from None

    def pods(self) -> list[dict]:
        return [p for p in self.testbed.list("pods", OPERATOR_NAMESPACE, f"app.kubernetes.io/instance={self.release}")
                if not p["metadata"].get("deletionTimestamp")]

    def exited(self) -> str | None:
        """None while every container of its pods runs (or is about to); otherwise why not: each
        such container's state, its last termination (exit code, reason) and the end of the log of
        the container that ended, which `kubectl logs` without --previous no longer shows."""
        down = []
        for p in self.pods():
            for s in p.get("status", {}).get("containerStatuses", []):
                state = s.get("state") or {}
                if (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff" or "terminated" in state:
                    down.append((p["metadata"]["name"], s))
        if not down:
            return None
        out = []
        for pod, s in down:
            ended = (s.get("state") or {}).get("terminated") or (s.get("lastState") or {}).get("terminated") or {}
            previous = "terminated" not in (s.get("state") or {})
            log = self.testbed.kubectl("logs", pod, "-n", OPERATOR_NAMESPACE, *(["--previous"] if previous else []),
                                       check=False).stdout
            out.append(f"--- operator pod {pod}: restarts {s.get('restartCount')}, state {json.dumps(s.get('state'))}, "
                       f"ended with exit code {ended.get('exitCode')} ({ended.get('reason')}) at "
                       f"{ended.get('finishedAt')}; the end of that container's log:\n" + "\n".join(log.splitlines()[-40:])
                       + "\nthe kubelet on it (probes, kills):\n" + "\n".join(_kubelet_lines(pod)[-10:]))
        return "operator exited:\n" + "\n".join(out)

    def kill(self) -> None:
        """Gone at once, mid-work (no graceful shutdown), and not restarted until start()."""
        self.testbed.kubectl("-n", OPERATOR_NAMESPACE, "scale", "deployment", self.deployment, "--replicas=0")
        self.testbed.kubectl("-n", OPERATOR_NAMESPACE, "delete", "pod", "-l", f"app.kubernetes.io/instance={self.release}",
                             "--grace-period=0", "--force", check=False)

    def start(self) -> None:
        self.testbed.kubectl("-n", OPERATOR_NAMESPACE, "scale", "deployment", self.deployment, "--replicas=1")
        self.wait_ready()

    def uninstall(self) -> None:
        self.testbed.helm("uninstall", self.release, "-n", OPERATOR_NAMESPACE, check=False)


def _kubelet_lines(pod: str) -> list[str]:
    """The kubelet's log lines on `pod`'s probes, kills and exits (testbed/cluster.sh keeps the log
    in DIR/logs)."""
    said = re.compile(r"Probe failed|Killing|OOM|Back-off|exited|died|terminated", re.I)
    try:
        with open(DIR / "logs" / "kubelet.log", errors="replace") as f:
            return [line.rstrip()[:400] for line in f if pod in line and said.search(line)]
    except OSError as e:
        return [f"(no kubelet log: {e})"]


def wait_broker(op, namespace: str, name: str, timeout: float = 120) -> dict:
    tb = op.testbed

    def running():
        assert not (down := op.exited()), down
        txb = tb.get("txb", name, namespace)
        return txb if (txb.get("status") or {}).get("phase") == "Running" else None
    try:
        return wait_until(running, timeout, f"TxBroker {name} Running")
    except TimeoutError:
        pods = tb.kubectl("-n", namespace, "get", "pods,pvc", "-o", "wide", check=False).stdout
        logs = "".join(tb.pod_log(f"{name}-{i}", namespace)[-2000:] for i in range(3))
        raise AssertionError(f"{name} not Running. pods:\n{pods}\nbroker logs:\n{logs}\n"
                             f"operator log:\n{op.log.read_text()[-3000:]}")


def txbroker(name: str, **spec) -> dict:
    return {"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxBroker", "metadata": {"name": name},
            "spec": {"image": IMAGE, **spec}}


def admin(pod: dict) -> AdminClient:
    return AdminClient(f"http://{pod['status']['podIP']}:10912")


def broker_info(tb, namespace: str, pod_name: str) -> dict:
    return admin(tb.get("pod", pod_name, namespace)).get("/api/v1/broker")


def brokers_report(tb, namespace: str, name: str, replicas: int, log_chars: int = 3000) -> str:
    """For a failed wait: each broker's role, offsets and replication links, and the end of its log."""
    out = []
    for i in range(replicas):
        pod = f"{name}-{i}"
        try:
            info = broker_info(tb, namespace, pod)
            keep = ("role", "epoch", "master", "log_end_offset", "durable_offset", "local_durable_offset",
                    "pending_transactions", "replication")
            state = json.dumps({k: info.get(k) for k in keep})
        except Exception as e:   # noqa: BLE001 - a report, whatever state the broker is in
            state = f"admin API: {e}"
        out.append(f"--- {pod}: {state}\n{tb.pod_log(pod, namespace)[-log_chars:]}")
    return "\n".join(out)


def consumer_pod(name: str, address: str, topic: str) -> dict:
    """`txbroker tail` in a pod, as a user reads a topic."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "orders"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": BROKER_IMAGE,
                                     "args": ["tail", "--broker", address, "--topic", topic]}]}}


def finished(tb, namespace: str, pod: str) -> dict | None:
    p = tb.get("pod", pod, namespace)
    return p if p and p["status"].get("phase") in ("Succeeded", "Failed") else None


def read_topic(tb, namespace: str, address: str, topic: str, pod: str, timeout: float = 120) -> list[str]:
    """Every committed message of `topic`, read by a consumer pod named `pod`: the lines `txbroker
    tail` printed, one per message."""
    tb.apply(consumer_pod(pod, address, topic), namespace)
    p = wait_until(lambda: finished(tb, namespace, pod), timeout, f"consumer {pod} to finish")
    out = tb.logs(pod, namespace)
    assert p["status"]["phase"] == "Succeeded", out[-2000:]
    return [line for line in out.splitlines() if line.strip()]


def addresses(tb, namespace: str, name: str, replicas: int) -> list[str]:
    return [f"{tb.get('pod', f'{name}-{i}', namespace)['status']['podIP']}:10911" for i in range(replicas)]


def events_for(tb, namespace: str, name: str) -> list[dict]:
    out = tb.kubectl("-n", namespace, "get", "events", "-o", "json",
                     "--field-selector", f"involvedObject.name={name}").stdout
    return json.loads(out)["items"]


def service_endpoints(tb, namespace: str, service: str, port: str = "client") -> list[str]:
    """HOST:PORT of the ready endpoints of a Service's `port`, from its EndpointSlices: where
    kube-proxy sends the Service's traffic."""
    out = tb.kubectl("-n", namespace, "get", "endpointslices", "-l", f"kubernetes.io/service-name={service}",
                     "-o", "json").stdout
    found = []
    for s in json.loads(out)["items"]:
        number = next((p["port"] for p in s.get("ports") or [] if p.get("name") == port), None)
        if number is None:
            continue
        for ep in s.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready"):
                found += [f"{a}:{number}" for a in ep["addresses"]]
    return sorted(found)


def wait_rolled(tb, namespace: str, name: str, replicas: int, image: str, timeout: float,
                before: dict[str, str]) -> tuple[dict, list[str]]:
    """Wait until every pod runs `image` and the TxBroker is Running. Assert no two brokers were
    down (deleted, being deleted or not ready) at any time we looked. Return the TxBroker and the
    order in which the pods of `before` (pod name -> uid before the change) were taken down."""
    max_down, order = 0, []

    def rolled():
        nonlocal max_down
        pods = {f"{name}-{i}": tb.get("pod", f"{name}-{i}", namespace) for i in range(replicas)}
        for n, p in pods.items():
            if n in before and n not in order and (p is None or p["metadata"].get("deletionTimestamp")
                                                   or p["metadata"]["uid"] != before[n]):
                order.append(n)
        max_down = max(max_down, sum(1 for p in pods.values() if p is None or p["metadata"].get("deletionTimestamp")
                                     or not ready(p)))
        t = tb.get("txb", name, namespace)
        return (all(p and p["spec"]["containers"][0]["image"] == image and ready(p) for p in pods.values())
                and t["status"]["phase"] == "Running" and t)
    txb = wait_until(rolled, timeout, f"every {name} pod on {image}", interval=0.1)
    assert max_down <= 1, "more than one broker was down at once"
    return txb, order
