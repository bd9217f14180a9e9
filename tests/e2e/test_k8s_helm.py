"""The Helm chart: lint, render, install / upgrade / uninstall against the real API server."""

from __future__ import annotations

import json

import pytest
import yaml
from cluster import ROOT
from support.waiting import wait_until

pytestmark = pytest.mark.e2e

CHART = str(ROOT / "helm" / "txbroker")


def docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_lint_strict(testbed):
    r = testbed.helm("lint", "--strict", CHART)
    assert "1 chart(s) linted, 0 chart(s) failed" in r.stdout


def test_lint_strict_with_every_option(testbed):
    testbed.helm("lint", "--strict", CHART, "--set", "txbroker.create=true",
                 "--set", "operator.watchNamespaces={a,b}", "--set", "txbroker.storage.size=1Gi")


def test_template_renders_what_the_operator_needs(testbed):
    out = testbed.helm("template", "rel", CHART, "-n", "txb-system").stdout
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs(out))
    assert kinds == [("ClusterRole", "rel-txbroker-operator"), ("ClusterRole", "rel-txbroker-operator-observer"),
                     ("ClusterRoleBinding", "rel-txbroker-operator"),
                     ("ClusterRoleBinding", "rel-txbroker-operator-observer"),
                     ("Deployment", "rel-txbroker-operator"),
                     ("Role", "rel-txbroker-operator-leader-election"),       # its Lease, in txb-system
                     ("RoleBinding", "rel-txbroker-operator-leader-election"),
                     ("ServiceAccount", "rel-txbroker-operator")]
    deploy = next(d for d in docs(out) if d["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert "--all-namespaces" in container["args"]
    # two replicas, one acting through the Lease (leader election)
    assert deploy["spec"]["replicas"] == 2
    assert {"name": "TXBROKER_OPERATOR_LEASE_NAME", "value": "rel-txbroker-operator-leader"} in container["env"]
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "rel-txbroker-operator"


def operator_pod(testbed) -> dict:
    out = testbed.helm("template", "rel", CHART, "-n", "txb-system").stdout
    return next(d for d in docs(out) if d["kind"] == "Deployment")["spec"]["template"]["spec"]


def test_operator_runs_locked_down_with_resources(testbed):
    pod = operator_pod(testbed)
    (container,) = pod["containers"]
    pod_sc, sc = pod.get("securityContext", {}), container.get("securityContext", {})
    assert pod_sc.get("runAsNonRoot") is True and pod_sc.get("runAsUser", 1) != 0
    assert sc.get("readOnlyRootFilesystem") is True
    assert sc.get("allowPrivilegeEscalation") is False
    assert sc.get("capabilities", {}).get("drop") == ["ALL"] and not sc["capabilities"].get("add")
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert "memory" in container["resources"]["limits"]


def test_operator_has_a_writable_temp_dir(testbed):
    # tempfile writes under $TMPDIR, else /tmp; under readOnlyRootFilesystem that must be a volume
    pod = operator_pod(testbed)
    (container,) = pod["containers"]
    tmpdir = next((e["value"] for e in container.get("env", []) if e["name"] == "TMPDIR" and "value" in e), "/tmp")
    empty_dirs = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    mounted = {m["mountPath"].rstrip("/") or "/": m for m in container.get("volumeMounts", [])}
    mount = mounted.get(tmpdir.rstrip("/"))
    assert mount is not None and mount["name"] in empty_dirs and not mount.get("readOnly")


def test_template_namespaced_rbac(testbed):
    out = testbed.helm("template", "rel", CHART, "--set", "operator.watchNamespaces={team-a,team-b}").stdout
    kinds = sorted((d["kind"], d["metadata"].get("namespace")) for d in docs(out) if "Role" in d["kind"])
    assert kinds == [("ClusterRole", None), ("ClusterRoleBinding", None),   # only list/watch CRDs, namespaces
                     ("Role", "default"),            # the release namespace: the leader-election Lease
                     ("Role", "team-a"), ("Role", "team-b"),
                     ("RoleBinding", "default"), ("RoleBinding", "team-a"), ("RoleBinding", "team-b")]
    cluster_role = next(d for d in docs(out) if d["kind"] == "ClusterRole")
    assert cluster_role["rules"] == [
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}]
    deploy = next(d for d in docs(out) if d["kind"] == "Deployment")
    assert {"--namespace=team-a", "--namespace=team-b"} <= set(deploy["spec"]["template"]["spec"]["containers"][0]["args"])


def test_rendered_manifests_pass_server_side_validation(crds, namespace):
    out = crds.helm("template", "rel", CHART, "-n", namespace, "--set", "txbroker.create=true",
                    "--set", "txbroker.replicas=3", "--set", "txbroker.storage.size=1Gi",
                    "--set", "txbroker.failover.gracePeriodSeconds=5",
                    "--set-json", 'producerGroups=[{"name": "payments", "groupName": "PG_Payments", '
                                  '"checkIntervalSeconds": 2, "checkMode": "http", "webhookUrl": "http://hook/check"}]'
                    ).stdout
    r = crds.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=out)
    assert "txbroker.txbroker.dev/rel created (server dry run)" in r.stdout
    assert "txproducergroup.txbroker.dev/payments created (server dry run)" in r.stdout
    pg = next(d for d in docs(out) if d["kind"] == "TxProducerGroup")
    assert pg["spec"] == {"brokerRef": {"name": "rel"}, "groupName": "PG_Payments", "checkIntervalSeconds": 2,
                          "checkMode": "http", "webhookUrl": "http://hook/check"}


@pytest.mark.parametrize("setting, words", [
    ("operator.replicas=9", "/operator/replicas"),
    ("txbroker.replicas=10", "/txbroker/replicas"),
    ("txbroker.replication=FAST", "/txbroker/replication"),
    ("operator.bogus=1", "bogus"),
    ("txbroker.failover.gracePeriodSeconds=0", "/txbroker/failover/gracePeriodSeconds"),
    ("producerGroups[0].name=Not_A_Name", "/producerGroups/0/name"),
])
def test_values_schema_refuses_bad_values(testbed, setting, words):
    r = testbed.helm("template", "rel", CHART, "--set", setting, check=False)
    assert r.returncode != 0 and "values don't meet the specifications of the schema" in r.stderr, r.stderr
    assert words in r.stderr, r.stderr


def test_install_upgrade_uninstall(testbed, namespace):
    release = "txb"
    # the operator watches this namespace only: other tests' TxBrokers on the cluster are not its own
    r = testbed.helm("install", release, CHART, "-n", namespace, "--set", "txbroker.create=true",
                     "--set", "txbroker.name=demo", "--set", f"operator.watchNamespaces={{{namespace}}}",
                     "--set", "operator.resyncSeconds=2")
    assert "STATUS: deployed" in r.stdout
    assert "kubectl -n %s get txb demo" % namespace in r.stdout        # NOTES.txt
    # CRDs from the chart's crds/ (created unless present), the operator and its RBAC, the TxBroker
    assert testbed.get("crd", "txbrokers.txbroker.dev") is not None
    deploy = testbed.get("deployment", "txb-txbroker-operator", namespace)
    assert deploy["spec"]["template"]["spec"]["containers"][0]["image"] == "txbroker/operator:0.2.0"
    assert testbed.get("serviceaccount", "txb-txbroker-operator", namespace) is not None
    assert testbed.get("role", "txb-txbroker-operator", namespace) is not None
    assert testbed.get("txb", "demo", namespace)["spec"]["replicas"] == 1
    # and it runs: the operator's pod brings the chart's TxBroker up on the node
    wait_until(lambda: (testbed.get("txb", "demo", namespace).get("status") or {}).get("phase") == "Running", 180,
             "the chart's TxBroker demo Running")
    sa = f"system:serviceaccount:{namespace}:txb-txbroker-operator"
    can = lambda *a: testbed.kubectl("auth", "can-i", *a, "--as", sa, "-n", namespace, check=False).stdout.strip()  # noqa: E731
    assert can("create", "pods") == "yes"
    assert can("patch", "txbrokers.txbroker.dev") == "yes"
    assert can("get", "secrets") == "yes"          # the Secrets a TxBroker names: read, never written
    assert can("list", "secrets") == "no" and can("update", "secrets") == "no"   # least privilege
    assert can("delete", "services") == "no"

    r = testbed.helm("upgrade", release, CHART, "-n", namespace, "--reuse-values",
                     "--set", "operator.image.tag=0.2.0", "--set", "txbroker.replicas=3")
    assert "STATUS: deployed" in r.stdout and "REVISION: 2" in r.stdout
    deploy = testbed.get("deployment", "txb-txbroker-operator", namespace)
    assert deploy["spec"]["template"]["spec"]["containers"][0]["image"] == "txbroker/operator:0.2.0"
    assert testbed.get("txb", "demo", namespace)["spec"]["replicas"] == 3
    history = json.loads(testbed.helm("history", release, "-n", namespace, "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2]

    testbed.helm("uninstall", release, "-n", namespace, "--wait")
    assert testbed.get("deployment", "txb-txbroker-operator", namespace) is None
    assert testbed.get("role", "txb-txbroker-operator", namespace) is None
    assert testbed.get("txb", "demo", namespace) is None
    # Helm never deletes CRDs it installed from crds/
    assert testbed.get("crd", "txbrokers.txbroker.dev") is not None
