"""The local kubelet's configMap/secret/downwardAPI volumes follow their source while the pod runs, and
its HTTPS probes do not verify certificates - as the real kubelet's (tests/k8s/kubelet.py)."""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import urllib.error
import urllib.request

import pytest
import trustme
from k8s_testbed import kubelet, wait_for

pytestmark = pytest.mark.e2e

# Reads files by path (as a process watching its config would) and prints, whenever what it read
# changed, one JSON line {label: content, or null when the file does not exist}. It reads far more
# often than the kubelet writes, so a half-written or briefly missing file would show up in the log.
READER = r"""
import json, pathlib, sys, time
paths = dict(a.split("=", 1) for a in sys.argv[1:])
last = None
while True:
    seen = {}
    for label, p in paths.items():
        try:
            seen[label] = pathlib.Path(p).read_text()
        except FileNotFoundError:
            seen[label] = None
    if seen != last:
        print(json.dumps(seen, sort_keys=True), flush=True)
        last = seen
    time.sleep(0.01)
"""

# An HTTPS server on the pod IP with the certificate of a mounted kubernetes.io/tls Secret.
TLS_SERVER = r"""
import http.server, os, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/readyz" else 404); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1] + "/tls.crt", sys.argv[1] + "/tls.key")
srv = http.server.HTTPServer((os.environ["POD_IP"], 8443), H)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
"""


def reader_pod(name: str, namespace: str, files: dict[str, str], volumes: list[dict],
               mounts: list[dict], labels: dict | None = None) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "containers": [{
                "name": "reader", "image": "local/python",
                "command": [sys.executable, "-c", READER],
                "args": [f"{label}={path}" for label, path in files.items()],
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        },
    }


def seen_states(testbed, name: str, namespace: str) -> list[dict]:
    """What the reader printed, in order (the log's other lines are the kubelet's start markers)."""
    return [json.loads(line) for line in testbed.pod_log(name, namespace, "reader").splitlines()
            if line.startswith("{")]


def wait_for_state(testbed, name: str, namespace: str, expected: dict, what: str) -> list[dict]:
    return wait_for(lambda: (s := seen_states(testbed, name, namespace)) and s[-1] == expected and s,
                    30, what)


def running(testbed, name: str, namespace: str) -> dict:
    return wait_for(lambda: (p := testbed.get("pod", name, namespace))
                    and (p.get("status") or {}).get("phase") == "Running" and p, 30, f"pod {name} Running")


def restart_count(testbed, name: str, namespace: str) -> int:
    return testbed.get("pod", name, namespace)["status"]["containerStatuses"][0]["restartCount"]


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def test_configmap_and_secret_volumes_follow_their_objects(testbed, namespace):
    testbed.kubectl("-n", namespace, "create", "configmap", "conf",
                    "--from-literal=greeting=hello", "--from-literal=gone=bye")
    testbed.kubectl("-n", namespace, "create", "secret", "generic", "creds", "--from-literal=password=s1")
    files = {"greeting": "/etc/conf/greeting", "gone": "/etc/conf/gone", "added": "/etc/conf/added",
             "password": "/etc/creds/password", "nested": "/etc/items/deep/er/greeting.txt",
             "pinned": "/etc/pinned/greeting"}
    testbed.apply(reader_pod("reader", namespace, files, volumes=[
        {"name": "conf", "configMap": {"name": "conf"}},
        {"name": "creds", "secret": {"secretName": "creds"}},
        {"name": "items", "configMap": {"name": "conf", "items": [{"key": "greeting",
                                                                  "path": "deep/er/greeting.txt"}]}},
    ], mounts=[
        {"name": "conf", "mountPath": "/etc/conf"},
        {"name": "creds", "mountPath": "/etc/creds"},
        {"name": "items", "mountPath": "/etc/items"},
        {"name": "conf", "mountPath": "/etc/pinned/greeting", "subPath": "greeting"},
    ]))
    running(testbed, "reader", namespace)
    wait_for_state(testbed, "reader", namespace,
                   {"greeting": "hello", "gone": "bye", "added": None, "password": "s1", "nested": "hello",
                    "pinned": "hello"}, "the reader to see the first contents")
    pids = testbed.pod_pids("reader", namespace)

    testbed.kubectl("-n", namespace, "patch", "configmap", "conf", "--type", "merge",
                    "-p", json.dumps({"data": {"greeting": "hi", "gone": None, "added": "new"}}))
    testbed.kubectl("-n", namespace, "patch", "secret", "creds", "--type", "merge",
                    "-p", json.dumps({"data": {"password": b64("s2")}}))
    states = wait_for_state(testbed, "reader", namespace,
                            {"greeting": "hi", "gone": None, "added": "new", "password": "s2", "nested": "hi",
                             "pinned": "hello"}, "the reader to see the new contents")

    # whole old or whole new content at every read: never empty, half-written or missing
    assert {s["greeting"] for s in states} <= {"hello", "hi"}, states
    assert {s["nested"] for s in states} <= {"hello", "hi"}, states
    assert {s["password"] for s in states} <= {"s1", "s2"}, states
    assert {s["pinned"] for s in states} == {"hello"}, states     # subPath: a copy from container start
    assert restart_count(testbed, "reader", namespace) == 0
    assert testbed.pod_pids("reader", namespace) == pids

    # AtomicWriter's layout: one timestamped directory (the old one removed), ..data -> it, key -> ..data/key
    vol = kubelet.pod_dir(testbed.kubelet_dir, namespace, "reader") / "volumes" / "conf"
    entries = sorted(os.listdir(vol))
    stamped = [e for e in entries if e.startswith("..") and e != "..data"]
    assert entries == stamped + ["..data", "added", "greeting"], entries
    assert len(stamped) == 1 and os.readlink(vol / "..data") == stamped[0]
    assert os.readlink(vol / "greeting") == "..data/greeting"
    assert os.readlink(vol.parent / "items" / "deep") == "..data/deep"


def test_downward_api_volume_follows_labels(testbed, namespace):
    testbed.apply(reader_pod("labels", namespace, {"labels": "/etc/podinfo/labels"}, labels={"color": "red"},
                             volumes=[{"name": "podinfo", "downwardAPI": {"items": [
                                 {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}],
                             mounts=[{"name": "podinfo", "mountPath": "/etc/podinfo"}]))
    running(testbed, "labels", namespace)
    wait_for_state(testbed, "labels", namespace, {"labels": 'color="red"'}, "the first labels")
    testbed.kubectl("-n", namespace, "label", "pod", "labels", "color=blue", "--overwrite")
    wait_for_state(testbed, "labels", namespace, {"labels": 'color="blue"'}, "the new labels")
    assert restart_count(testbed, "labels", namespace) == 0


def test_https_probe_does_not_verify_the_certificate(testbed, namespace):
    cert = trustme.CA().issue_cert("tls.example")       # a CA nobody trusts, a name nobody dials
    testbed.apply({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "tls", "namespace": namespace},
        "data": {"tls.crt": base64.b64encode(cert.cert_chain_pems[0].bytes()).decode(),
                 "tls.key": base64.b64encode(cert.private_key_pem.bytes()).decode()},
    })
    testbed.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tls", "namespace": namespace},
        "spec": {
            "containers": [{
                "name": "web", "image": "local/python",
                "command": [sys.executable, "-c", TLS_SERVER, "/etc/tls"],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8443, "scheme": "HTTPS"},
                                   "periodSeconds": 1},
                "volumeMounts": [{"name": "tls", "mountPath": "/etc/tls"}],
            }],
            "volumes": [{"name": "tls", "secret": {"secretName": "tls"}}],
        },
    })
    pod = wait_for(lambda: (p := testbed.get("pod", "tls", namespace)) and any(
        c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or []) and p,
        30, "pod tls Ready by its HTTPS probe")
    # ...though a client that checks certificates refuses this server
    with pytest.raises(urllib.error.URLError) as e:
        urllib.request.urlopen(f"https://{pod['status']['podIP']}:8443/readyz", timeout=5,
                               context=ssl.create_default_context())
    assert isinstance(e.value.reason, ssl.SSLCertVerificationError)


def test_atomic_write_swaps_data_and_keeps_identical_content(tmp_path):
    vol = tmp_path / "vol"
    assert kubelet.atomic_write(vol, {"a": b"1", "n/x": b"2", "gone": b"3"})
    first = os.readlink(vol / "..data")
    assert not kubelet.atomic_write(vol, {"a": b"1", "n/x": b"2", "gone": b"3"})   # same content: untouched
    assert os.readlink(vol / "..data") == first
    assert kubelet.atomic_write(vol, {"a": b"11", "n/x": b"22", "new": b"4"})
    second = os.readlink(vol / "..data")
    assert second != first and not (vol / first).exists()
    assert sorted(os.listdir(vol)) == sorted([second, "..data", "a", "n", "new"])
    assert (vol / "a").read_text() == "11" and (vol / "n" / "x").read_text() == "22"
    assert kubelet.read_payload(vol) == {"a": b"11", "n/x": b"22", "new": b"4"}
