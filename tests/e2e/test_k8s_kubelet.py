"""The local kubelet (tests/k8s/kubelet.py) against the real API server: what other e2e tests rely on."""

from __future__ import annotations

import json
import signal
import sys
import threading
import urllib.request

import pytest
from k8s_testbed import wait_for

pytestmark = pytest.mark.e2e

# A pod that shows what the kubelet does: $(VAR) expansion, downward-API env, a ConfigMap volume,
# a data volume (mount paths substituted in args), then an HTTP server on the pod IP.
SCRIPT = r"""
import http.server, os, sys, pathlib
data, conf, ip = sys.argv[1], sys.argv[2], os.environ["POD_IP"]
boots = pathlib.Path(data, "boots")
boots.write_text(boots.read_text() + "x" if boots.exists() else "x")
greeting = pathlib.Path(conf, "greeting").read_text()
body = f"{os.environ['POD_NAME']}/{os.environ['POD_NAMESPACE']} {ip} {greeting} boots={len(boots.read_text())} addr={os.environ['ADDR']}"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(body.encode())
    def log_message(self, *a): pass
http.server.HTTPServer((ip, 8080), H).serve_forever()
"""


def demo_pod(name: str, namespace: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{
                "name": "web", "image": "local/python",
                "command": [sys.executable, "-c", SCRIPT],
                "args": ["/var/lib/demo", "/etc/demo"],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "ADDR", "value": "$(POD_IP):8080"},
                ],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/demo"},
                                 {"name": "conf", "mountPath": "/etc/demo"}],
            }],
            "volumes": [{"name": "data", "emptyDir": {}},
                        {"name": "conf", "configMap": {"name": "demo-conf"}}],
        },
    }


def pod_ready(pod: dict | None) -> bool:
    conds = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.read().decode()


@pytest.fixture
def demo(testbed, namespace):
    testbed.kubectl("-n", namespace, "create", "configmap", "demo-conf", "--from-literal=greeting=hello")
    testbed.apply(demo_pod("demo", namespace))
    pod = wait_for(lambda: (p := testbed.get("pod", "demo", namespace)) and pod_ready(p) and p, 30,
                   "pod demo Ready")
    return pod


def test_node_is_registered_ready(testbed):
    nodes = json.loads(testbed.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert [n["metadata"]["name"] for n in nodes] == ["testbed-node"]
    ready = {c["type"]: c["status"] for c in nodes[0]["status"]["conditions"]}["Ready"]
    assert ready == "True"


def test_pod_runs_as_a_local_process(testbed, namespace, demo):
    assert demo["spec"]["nodeName"] == "testbed-node"     # bound by the kubelet: there is no scheduler
    ip = demo["status"]["podIP"]
    assert ip.startswith("127.") and ip != "127.0.0.1"
    assert demo["status"]["phase"] == "Running"
    body = http_get(f"http://{ip}:8080/")
    assert body == f"demo/{namespace} {ip} hello boots=1 addr={ip}:8080"


def test_sigkill_restarts_the_container(testbed, namespace, demo):
    rest = testbed.rest()
    rv = demo["metadata"]["resourceVersion"]
    seen: list[tuple[bool, int]] = []

    def observe():
        for ev in rest.watch(f"/api/v1/namespaces/{namespace}/pods", rv,
                             query={"fieldSelector": "metadata.name=demo"}):
            if ev["type"] not in ("ADDED", "MODIFIED"):
                continue
            pod = ev["object"]
            seen.append((pod_ready(pod), pod["status"]["containerStatuses"][0]["restartCount"]))
            if seen[-1] == (True, 1):
                return

    t = threading.Thread(target=observe, daemon=True)
    t.start()
    old_pids = testbed.pod_pids("demo", namespace)
    testbed.kill_pod("demo", namespace, signal.SIGKILL)
    t.join(60)
    assert seen and seen[-1] == (True, 1), seen
    assert (False, 0) in seen or (False, 1) in seen, f"Ready never went false: {seen}"
    pod = testbed.get("pod", "demo", namespace)
    cs = pod["status"]["containerStatuses"][0]
    assert cs["lastState"]["terminated"]["exitCode"] == 137
    assert testbed.pod_pids("demo", namespace) != old_pids
    # same address, and the emptyDir kept what the first run wrote
    assert http_get(f"http://{pod['status']['podIP']}:8080/").endswith(f"boots=2 addr={pod['status']['podIP']}:8080")


def test_deleted_pod_is_stopped_and_data_survives_recreation(testbed, namespace, demo):
    ip = demo["status"]["podIP"]
    pids = testbed.pod_pids("demo", namespace)
    testbed.kubectl("-n", namespace, "delete", "pod", "demo", "--wait=true", "--timeout=60s")
    assert testbed.get("pod", "demo", namespace) is None
    for pid in pids.values():
        wait_for(lambda: not _alive(pid), 10, f"process {pid} gone")

    testbed.apply(demo_pod("demo", namespace))
    pod = wait_for(lambda: (p := testbed.get("pod", "demo", namespace)) and pod_ready(p) and p, 30,
                   "recreated pod demo Ready")
    assert pod["status"]["podIP"] == ip
    assert "boots=2" in http_get(f"http://{ip}:8080/")


def test_failing_command_is_reported(testbed, namespace):
    testbed.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "crash", "namespace": namespace},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "c", "image": "x", "command": [sys.executable, "-c", "raise SystemExit(3)"]}]},
    })
    pod = wait_for(lambda: (p := testbed.get("pod", "crash", namespace)) and p["status"].get("phase") == "Failed" and p,
                   30, "pod crash Failed")
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def _alive(pid: int) -> bool:
    import os
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie not yet reaped by the kubelet counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
