"""The operator under test and helpers for TxBrokers on the testbed (tests/e2e/test_k8s_operator.py,
test_k8s_security.py).

The operator runs as `python -m txbroker_operator` (Kopf) with the ServiceAccount token that the
Helm chart's RBAC grants, so the chart's least-privilege rules are exercised too: it watches one
namespace (`operator.watchNamespaces`, a Role there), where these tests put their TxBrokers, so
TxBrokers that other tests create elsewhere on this testbed are left alone. The local kubelet
runs the broker pods' `txbroker broker ...` command from PATH (.venv/bin first).

The testbed has no kube-proxy: a client reaches `<name>-master` as a client without one does, at the
addresses in the Service's EndpointSlices (kube-controller-manager keeps them), re-reading them when
the master it talks to stops answering (`service_endpoints`). The API server refuses loopback
addresses in EndpointSlices: on the default loopback pod network `service_endpoints` resolves the
Service as the EndpointSlice controller would (its selector, the Ready pods, the target port), so
what the operator controls, the selector and the pods' labels, is what decides; with the pods on
a non-loopback local range (TXBROKER_POD_NET=198.18 after `ip route add local 198.18.0.0/16 dev
lo`, tests/k8s/README.md) the real EndpointSlices are read.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest
import yaml
from k8s_testbed import ROOT, wait_for

from txbroker.client.admin import AdminClient

from support.refusals import end_transaction_refusal  # noqa: F401 - the e2e tests import it from here

CHART = str(ROOT / "helm" / "txbroker")
IMAGE = "txbroker/broker:test"     # never pulled: the local kubelet runs `txbroker` from PATH


def healthz(ip: str, path: str = "/healthz") -> int:
    with urllib.request.urlopen(f"http://{ip}:10912{path}", timeout=2) as r:
        return r.status


def ready(pod: dict | None) -> bool:
    conds = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def start_operator(crds, tmp_path_factory, namespace: str = "txbroker-e2e"):
    """Generator for a module-scoped fixture: yields an OperatorProcess.
    The chart's RBAC installed, and the operator running with its ServiceAccount's token."""
    tb = crds
    if not shutil.which("txbroker", path=tb.pod_path):
        pytest.fail("the broker CLI `txbroker` is not on the pods' PATH "
                    f"({tb.pod_path.split(os.pathsep)[0]} first): install the project "
                    "(`make venv`, pip install -e .) - contract: txbroker broker --data-dir DIR --listen "
                    "HOST:PORT --admin-listen HOST:PORT --role master|slave [--master HOST:PORT]", pytrace=False)
    ns = tb.create_namespace("txbroker-system")
    watched = tb.create_namespace(namespace)
    release = f"op-{namespace}"      # one release per watched namespace: modules never share RBAC
    tb.helm("upgrade", "--install", release, CHART, "-n", ns, "--set", "operator.replicas=0",
            "--set", f"operator.watchNamespaces={{{watched}}}")
    sa = f"{release}-txbroker-operator"
    token = tb.kubectl("-n", ns, "create", "token", sa, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(tb.kubeconfig.read_text())
    work = tmp_path_factory.mktemp("operator")
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "op",
        "clusters": admin["clusters"],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "op", "context": {"cluster": admin["clusters"][0]["name"], "user": sa}}],
    }))
    env = tb.env(KUBECONFIG=str(kubeconfig), TXBROKER_OPERATOR_RESYNC_SECONDS="1", TXBROKER_OPERATOR_NAMESPACE=ns,
                 PYTHONPATH=os.pathsep.join([str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]))
    op = OperatorProcess(tb, watched, env, work)
    yield op
    op.stop()
    text = op.log.read_text(errors="replace")
    denied = [line for line in text.splitlines() if re.search(r'Forbidden|HTTP/1\.1" 403', line)]
    assert not denied, "the operator hit RBAC denials:\n" + "\n".join(denied[:5])


class OperatorProcess:
    """`python -m txbroker_operator` watching one namespace; can be killed and started again."""

    def __init__(self, testbed, namespace: str, env: dict, work):
        self.testbed, self.namespace, self.env, self.work = testbed, namespace, env, work
        self.log = work / "operator.log"
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "txbroker_operator", f"--namespace={self.namespace}", "--verbose"],
                env=self.env, stdout=logf, stderr=subprocess.STDOUT, cwd=self.work)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()


def wait_broker(op, namespace: str, name: str, timeout: float = 90) -> dict:
    tb = op.testbed

    def running():
        assert op.proc.poll() is None, "operator exited:\n" + op.log.read_text()[-4000:]
        txb = tb.get("txb", name, namespace)
        return txb if (txb.get("status") or {}).get("phase") == "Running" else None
    try:
        return wait_for(running, timeout, f"TxBroker {name} Running")
    except TimeoutError:
        pods = tb.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False).stdout
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


def addresses(tb, namespace: str, name: str, replicas: int) -> list[str]:
    return [f"{tb.get('pod', f'{name}-{i}', namespace)['status']['podIP']}:10911" for i in range(replicas)]


def events_for(tb, namespace: str, name: str) -> list[dict]:
    out = tb.kubectl("-n", namespace, "get", "events", "-o", "json",
                     "--field-selector", f"involvedObject.name={name}").stdout
    return json.loads(out)["items"]


def condition(obj: dict, type_: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)




def service_endpoints(tb, namespace: str, service: str, port: str = "client") -> list[str]:
    """HOST:PORT of the ready endpoints of a Service's `port`: where a client without kube-proxy (or a
    headless-style resolver) sends its requests. From its EndpointSlices; on a loopback pod network,
    which the API server refuses in EndpointSlices, from what the EndpointSlice controller would put
    there: the Ready pods its selector matches, at the port's target port."""
    pods = json.loads(tb.kubectl("-n", namespace, "get", "pods", "-o", "json").stdout)["items"]
    if pods and not endpoints_possible(pods[0]):
        return _endpoints_by_selector(tb, namespace, service, port, pods)
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


def _endpoints_by_selector(tb, namespace: str, service: str, port: str, pods: list[dict]) -> list[str]:
    svc = tb.get("service", service, namespace)
    selector = svc["spec"].get("selector") or {}
    target = next(p.get("targetPort", p["port"]) for p in svc["spec"]["ports"] if p.get("name") == port)
    found = []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()) or not ready(pod):
            continue
        number = target if isinstance(target, int) else next(
            cp["containerPort"] for c in pod["spec"]["containers"] for cp in c.get("ports") or []
            if cp.get("name") == target)
        found.append(f"{pod['status']['podIP']}:{number}")
    return sorted(found)


def endpoints_possible(pod: dict) -> bool:
    """Whether the API server accepts this pod's address in EndpointSlices (not loopback)."""
    return not ipaddress.ip_address(pod["status"]["podIP"]).is_loopback
