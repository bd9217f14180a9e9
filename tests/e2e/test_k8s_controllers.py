"""The testbed's kube-controller-manager: what it does for the other e2e tests and the operator.

It runs only the garbage collector, the namespace controller and the endpoint controllers
(tests/k8s/testbed.sh), so these tests check those three behaviours with real objects:

* deleting an owner deletes what it owns (background and foreground propagation; orphan keeps them);
* a Service's EndpointSlice and Endpoints hold the ready pods its selector matches, and follow a
  relabelling (what the operator does on failover to move `<name>-master`);
* a deleted namespace is emptied and goes away.

The local kubelet gives pods loopback addresses (127.77.K.N), which the API server refuses in
Endpoints and EndpointSlices; the endpoint tests therefore use pods on a second Node that has no
kubelet of ours, whose status the test writes as that node's kubelet would (non-loopback addresses
from 198.18.0.0/15, the range reserved for benchmarks). The same check on the local kubelet's own
pods runs when the pod network is not loopback (TXBROKER_POD_NET, see tests/k8s/kubelet.py).
"""

from __future__ import annotations

import ipaddress
import json
import sys
import uuid

import pytest
from k8s_testbed import wait_for

pytestmark = pytest.mark.e2e

SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)"]


def create(tb, obj: dict, namespace: str) -> dict:
    """Create an object and return it as stored (with its uid)."""
    return json.loads(tb.kubectl("-n", namespace, "create", "-f", "-", "-o", "json", input=json.dumps(obj)).stdout)


def owned_by(owner: dict, block: bool = False) -> list[dict]:
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
           "uid": owner["metadata"]["uid"]}
    return [dict(ref, blockOwnerDeletion=True) if block else ref]


def pod(name: str, labels: dict | None = None, node: str | None = None, **meta) -> dict:
    """A pod the local kubelet runs (a sleeping process), or, with `node`, one bound to that node."""
    spec = {"containers": [{"name": "main", "image": "local/python", "command": SLEEPER}],
            # short grace: the namespace controller waits about half of it before looking again
            "terminationGracePeriodSeconds": 0 if node else 1}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}, **meta},
            "spec": spec}


def service(name: str, selector: dict, **meta) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, **meta},
            "spec": {"selector": selector, "ports": [{"name": "data", "port": 10911}]}}


def ready(p: dict | None) -> bool:
    conds = ((p or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def gone(tb, kind: str, name: str, namespace: str | None = None) -> bool:
    return tb.get(kind, name, namespace) is None


def endpoint_slices(tb, namespace: str, svc: str) -> list[dict]:
    out = tb.kubectl("-n", namespace, "get", "endpointslices", "-l", f"kubernetes.io/service-name={svc}",
                     "-o", "json").stdout
    return json.loads(out)["items"]


def slice_endpoints(tb, namespace: str, svc: str) -> dict[str, str]:
    """{address: pod name} of the ready endpoints in the Service's EndpointSlices."""
    return {addr: ep["targetRef"]["name"]
            for s in endpoint_slices(tb, namespace, svc) for ep in s.get("endpoints") or []
            if (ep.get("conditions") or {}).get("ready") for addr in ep["addresses"]}


def endpoints(tb, namespace: str, svc: str) -> dict[str, str]:
    """{ip: pod name} of the ready addresses in the Service's (core/v1) Endpoints."""
    ep = tb.get("endpoints", svc, namespace) or {}
    return {a["ip"]: a["targetRef"]["name"] for sub in ep.get("subsets") or [] for a in sub.get("addresses") or []}


# -- garbage collection --------------------------------------------------------------------------

def test_deleting_an_owner_deletes_its_pod_service_configmap_and_pdb(testbed, namespace):
    tb = testbed
    owner = create(tb, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace)
    refs = owned_by(owner)
    create(tb, pod("owned-pod", {"app": "owned"}, ownerReferences=refs), namespace)
    create(tb, service("owned-svc", {"app": "nothing-matches"}, ownerReferences=refs), namespace)
    create(tb, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned-cm", "ownerReferences": refs}},
           namespace)
    create(tb, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "owned-pdb", "ownerReferences": refs},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "owned"}}}}, namespace)
    wait_for(lambda: ready(tb.get("pod", "owned-pod", namespace)), 60, "owned-pod Ready")
    assert tb.pod_pids("owned-pod", namespace)
    # the endpoint slice controller gives even a Service without endpoints a (placeholder) slice,
    # owned by the Service: a second level of ownership for the collector to follow
    wait_for(lambda: endpoint_slices(tb, namespace, "owned-svc"), 60, "owned-svc's EndpointSlice")

    tb.kubectl("-n", namespace, "delete", "configmap", "owner")       # kubectl's default: background

    for kind, name in [("configmap", "owned-cm"), ("service", "owned-svc"), ("pdb", "owned-pdb"),
                       ("pod", "owned-pod")]:
        wait_for(lambda: gone(tb, kind, name, namespace), 60, f"{kind} {name} collected")
    wait_for(lambda: not endpoint_slices(tb, namespace, "owned-svc"), 60, "owned-svc's EndpointSlice collected")
    assert not tb.pod_pids("owned-pod", namespace)                     # the kubelet stopped its process


def test_foreground_deletion_removes_the_owner_after_its_dependents(testbed, namespace):
    tb = testbed
    owner = create(tb, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace)
    # a finalizer the test holds keeps the dependent, and so the owner, from going before we look
    hold = "txbroker.dev/test-hold"
    create(tb, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "dependent", "finalizers": [hold], "ownerReferences": owned_by(owner, block=True)}}, namespace)

    tb.kubectl("-n", namespace, "delete", "configmap", "owner", "--cascade=foreground", "--wait=false")

    dep = wait_for(lambda: (d := tb.get("configmap", "dependent", namespace)) and
                   d["metadata"].get("deletionTimestamp") and d, 60, "the collector deleting the dependent")
    assert dep["metadata"]["finalizers"] == [hold]
    o = tb.get("configmap", "owner", namespace)
    assert o is not None and o["metadata"].get("deletionTimestamp")      # waiting for its dependent
    assert "foregroundDeletion" in o["metadata"]["finalizers"]

    tb.kubectl("-n", namespace, "patch", "configmap", "dependent", "--type=json",
               "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')
    wait_for(lambda: gone(tb, "configmap", "dependent", namespace), 60, "dependent deleted")
    wait_for(lambda: gone(tb, "configmap", "owner", namespace), 60, "owner deleted after its dependent")


def test_orphan_deletion_keeps_dependents_and_drops_their_owner_reference(testbed, namespace):
    tb = testbed
    owner = create(tb, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace)
    create(tb, {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "dependent", "ownerReferences": owned_by(owner)}}, namespace)

    tb.kubectl("-n", namespace, "delete", "configmap", "owner", "--cascade=orphan")

    wait_for(lambda: gone(tb, "configmap", "owner", namespace), 60, "owner deleted")
    dep = wait_for(lambda: (d := tb.get("configmap", "dependent", namespace)) and
                   not d["metadata"].get("ownerReferences") and d, 60, "dependent orphaned")
    assert not dep["metadata"].get("deletionTimestamp")


# -- endpoints -----------------------------------------------------------------------------------

def check_endpoints_follow_the_master_label(tb, namespace: str, ips: dict[str, str]) -> None:
    """Pods a and b (ready, at ips[name]) exist with app=duo; `duo-master` selects role=master.
    The master's address is the Service's only endpoint, before and after the roles swap."""
    tb.kubectl("-n", namespace, "label", "pod", "a", "role=master")
    tb.kubectl("-n", namespace, "label", "pod", "b", "role=slave")
    create(tb, service("duo-master", {"app": "duo", "role": "master"}), namespace)
    wait_for(lambda: slice_endpoints(tb, namespace, "duo-master") == {ips["a"]: "a"}, 60,
             "duo-master's EndpointSlice holding pod a")
    wait_for(lambda: endpoints(tb, namespace, "duo-master") == {ips["a"]: "a"}, 60,
             "duo-master's Endpoints holding pod a")

    # failover as the operator does it: the old master loses the label, the new one gets it
    tb.kubectl("-n", namespace, "label", "pod", "a", "role=slave", "--overwrite")
    tb.kubectl("-n", namespace, "label", "pod", "b", "role=master", "--overwrite")
    wait_for(lambda: slice_endpoints(tb, namespace, "duo-master") == {ips["b"]: "b"}, 60,
             "duo-master's EndpointSlice following the label to pod b")
    wait_for(lambda: endpoints(tb, namespace, "duo-master") == {ips["b"]: "b"}, 60,
             "duo-master's Endpoints following the label to pod b")


@pytest.fixture
def remote_node(testbed):
    """A second Node with no kubelet of ours behind it: the test plays that node's kubelet."""
    name = f"remote-{uuid.uuid4().hex[:6]}"
    testbed.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    yield name
    testbed.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")


def report_running(tb, namespace: str, name: str, ip: str) -> None:
    """Write a pod's status as a kubelet does once its containers run and are ready."""
    status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
              "conditions": [{"type": t, "status": "True"} for t in ("Initialized", "ContainersReady", "Ready")]}
    tb.kubectl("-n", namespace, "patch", "pod", name, "--subresource=status", "--type=merge",
               "-p", json.dumps({"status": status}))


def test_service_endpoints_follow_pod_labels(testbed, namespace, remote_node):
    tb = testbed
    ips = {"a": "198.18.0.10", "b": "198.18.0.11"}
    for name, ip in ips.items():
        create(tb, pod(name, {"app": "duo"}, node=remote_node), namespace)
        report_running(tb, namespace, name, ip)
    check_endpoints_follow_the_master_label(tb, namespace, ips)


def test_service_endpoints_follow_labels_of_local_kubelet_pods(testbed, namespace):
    tb = testbed
    for name in ("a", "b"):
        create(tb, pod(name, {"app": "duo"}), namespace)
    ips = {name: wait_for(lambda: (p := tb.get("pod", name, namespace)) and ready(p) and p["status"]["podIP"],
                          60, f"pod {name} Ready")
           for name in ("a", "b")}
    if ipaddress.ip_address(ips["a"]).is_loopback:
        pytest.skip(f"the local kubelet's pods have loopback addresses ({ips['a']}), which the API server "
                    "refuses in Endpoints and EndpointSlices; set TXBROKER_POD_NET to a local non-loopback "
                    "range (tests/k8s/kubelet.py) for this check")
    check_endpoints_follow_the_master_label(tb, namespace, ips)


# -- namespaces ----------------------------------------------------------------------------------

def test_deleted_namespace_is_emptied_and_removed(testbed, crds, namespace):
    tb = testbed
    create(tb, pod("sleeper"), namespace)
    create(tb, service("svc", {"app": "x"}), namespace)
    create(tb, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"k": "v"}}, namespace)
    create(tb, {"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxBroker", "metadata": {"name": "inert"},
                "spec": {"image": "txbroker/broker:test", "replicas": 1}}, namespace)   # no operator watches here
    wait_for(lambda: ready(tb.get("pod", "sleeper", namespace)), 60, "pod sleeper Ready")
    assert tb.pod_pids("sleeper", namespace)

    tb.delete_namespace(namespace)

    wait_for(lambda: gone(tb, "namespace", namespace), 120, f"namespace {namespace} removed")
    assert not tb.pod_pids("sleeper", namespace)                       # the kubelet stopped its process
    assert tb.create_namespace(namespace) == namespace                 # the name is free again
    assert json.loads(tb.kubectl("-n", namespace, "get", "all,configmaps,txb", "-o", "json").stdout)["items"] == []
