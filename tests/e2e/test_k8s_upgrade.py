"""An upgrade under load on the real node (issue 32, item 2): the previous release (images and chart
built from the pinned older commit of tests/support/previous.py) installed by Helm, transactions,
a job and a consumer group's offsets on it, then `helm upgrade` to this tree's chart as
docs/upgrading.md says. The operator rolls the slaves first, then switches mastership over, then
replaces the old master; every acknowledged commit survives, none twice, nothing stays undecided,
the job opened before decides after, and the client operations that failed meanwhile are counted.

The CRDs are cluster-wide and shared with the other tests running beside this one: they stay the
current ones throughout (what docs/upgrading.md's first step, `kubectl apply -f crds/`, leaves), so
the previous operator runs against this tree's CRDs, which only add fields to its."""

from __future__ import annotations

import subprocess
import threading

import pytest
from support import previous, txload
from support.waiting import wait_until
from cluster import ROOT, VERSION
from operator_env import brokers_report, condition, events_for

from txbroker.client import JobCoordinator, Message, PullConsumer

pytestmark = pytest.mark.e2e

NAME, REPLICAS = "up", 3
CHART = str(ROOT / "helm" / "txbroker")


@pytest.fixture(scope="module")
def previous_images(testbed):
    """The previous release's broker and operator images, built from its tree (testbed/images.sh
    --source) and loaded into the node, as cluster.sh loads ours."""
    tree = previous.source()
    with testbed.exclusive("previous-images"):
        r = subprocess.run(["bash", str(ROOT / "testbed" / "images.sh"), "--source", str(tree)],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"building the previous release's images failed:\n{r.stderr[-3000:]}"
        for tar in r.stdout.split():
            testbed.run("ctr", "-a", testbed.sock, "-n", "k8s.io", "images", "import", tar)
    return tree


def images(tb, namespace: str) -> list[str]:
    return sorted(tb.get("pod", f"{NAME}-{i}", namespace)["spec"]["containers"][0]["image"] for i in range(REPLICAS))


def master_address(tb, namespace: str) -> str:
    """The master Service's ClusterIP: kube-proxy sends each new connection to the master of the
    moment, so the clients follow the switchover as a user's do."""
    return f"{tb.get('service', f'{NAME}-master', namespace)['spec']['clusterIP']}:10911"


def running(tb, namespace: str, image: str):
    t = tb.get("txb", NAME, namespace)
    pods = [tb.get("pod", f"{NAME}-{i}", namespace) for i in range(REPLICAS)]
    return (t and (t.get("status") or {}).get("phase") == "Running"
            and all(p and p["spec"]["containers"][0]["image"] == image and not p["metadata"].get("deletionTimestamp")
                    for p in pods)
            and all(b.get("inSync") for b in t["status"].get("brokers", []) if b["role"] == "slave") and t)


def test_helm_upgrade_from_the_previous_release_under_load(crds, namespace, previous_images):
    tb, old = crds, previous.PREVIOUS_VERSION
    release = f"upg-{namespace[-6:]}"   # its ClusterRoles are cluster-wide: one name per run
    values = ["--set", "txbroker.create=true", "--set", f"txbroker.name={NAME}",
              "--set", f"txbroker.replicas={REPLICAS}", "--set", "txbroker.replication=SYNC",
              "--set", "txbroker.flush=SYNC", "--set", "txbroker.transaction.checkIntervalSeconds=1",
              "--set", "txbroker.transaction.timeoutSeconds=1", "--set", "txbroker.transaction.checkMax=300",
              "--set", f"operator.watchNamespaces={{{namespace}}}", "--set", "operator.resyncSeconds=2"]
    r = tb.helm("install", release, str(previous_images / "helm" / "txbroker"), "-n", namespace, *values)
    assert "STATUS: deployed" in r.stdout
    try:
        wait_until(lambda: running(tb, namespace, f"txbroker/broker:{old}"), 240, f"TxBroker {NAME} Running on {old}")
    except TimeoutError:
        raise AssertionError(brokers_report(tb, namespace, NAME, REPLICAS)) from None

    address = master_address(tb, namespace)
    ledger, acked, failed, stop = txload.Ledger(), {}, [], threading.Event()
    load = threading.Thread(target=txload.run_load, args=([address], ledger, acked, stop, 4), kwargs={"failed": failed})
    load.start()
    try:
        wait_until(lambda: len(acked) >= 50, 60, f"load on {old}")
        # a job opened on the previous release, decided on this one; a consumer group's offset
        with JobCoordinator("upgrade-jobs", address) as c:
            job = c.open(timeout=3600, name="nightly-upgrade")
            member = c.send(job.job_id, Message("Jobs", b"job-body"))
        with PullConsumer(address) as c:
            ends = c.committed_offsets("billing", "Orders")[1]
            queue = max(ends, key=ends.get)
            offset = ends[queue] // 2
            assert offset > 0, ends
            c.commit_offsets("billing", {("Orders", queue): offset})

        # docs/upgrading.md, "The order": new CRDs (already applied: see the docstring), then the chart
        r = tb.helm("upgrade", release, CHART, "-n", namespace, "--reset-then-reuse-values")
        assert "STATUS: deployed" in r.stdout and "REVISION: 2" in r.stdout
        try:
            # the status by this release's operator: the previous one, the leader until its Lease
            # passes, may finish the roll itself on a slow node, and its status has no operatorVersion
            txb = wait_until(lambda: (t := running(tb, namespace, f"txbroker/broker:{VERSION}"))
                             and t["status"].get("operatorVersion") == VERSION and t, 600,
                             f"every {NAME} pod on {VERSION}, in the status of the {VERSION} operator", interval=1)
        except TimeoutError:
            raise AssertionError(brokers_report(tb, namespace, NAME, REPLICAS)) from None
        before = len(acked)
        wait_until(lambda: len(acked) >= before + 50, 60, f"load on {VERSION}")
    finally:
        stop.set()
        load.join(120)

    # what users read: one version everywhere, the roll told in Events, no failover
    assert txb["status"].get("operatorVersion") == VERSION
    assert {b.get("version") for b in txb["status"]["brokers"]} == {VERSION}
    out = tb.kubectl("-n", namespace, "get", "txb", NAME).stdout.splitlines()
    assert out[1].split()[out[0].split().index("VERSION")] == VERSION, out
    assert condition(txb, "ReplicationCompatible")["status"] == "True"
    said = [e["reason"] for e in events_for(tb, namespace, NAME)]
    assert "RollingUpdate" in said and "Switchover" in said and "FailedOver" not in said, said
    assert "lastFailover" not in txb["status"]

    # the job opened on the previous release decides on this one
    address = master_address(tb, namespace)
    with JobCoordinator("upgrade-jobs", address) as c:
        assert c.describe(name="nightly-upgrade").state == "OPEN"
        assert c.commit(job.job_id, [member]).state == "COMMITTED"
    wait_until(lambda: txload.visible(address, "Jobs") == {"job-body": 1}, 60, "the job's member visible once")
    # nothing acknowledged lost, nothing twice, nothing left undecided (the job's member was, until now)
    master_ip = tb.get("pod", txb["status"]["master"], namespace)["status"]["podIP"]
    txload.settle(address, f"http://{master_ip}:10912", ledger, timeout=120)
    problems = txload.invariant_violations(txload.visible(address), acked, must_keep_acked=True)
    assert not problems, problems[:10]
    with PullConsumer(address) as c:
        assert c.committed_offsets("billing", "Orders")[0] == {queue: offset}
    print(f"\nhelm upgrade {old} -> {VERSION} under load: {len(acked)} acknowledged, {len(failed)} client-visible "
          f"failures" + (f"; first: {failed[0]}" if failed else ""))
    tb.helm("uninstall", release, "-n", namespace, "--wait")
