"""The operator survives its own loss (issue #21): the chart's two operator replicas, one acting
through a Lease (operator/txbroker_operator/leadership.py), the other standing by.

The active operator is SIGKILLed (a crash: no graceful step-down, no release) right after it has
started a failover; once the Lease expires another operator process takes it (the standby, or the
killed leader's restarted container: both contend, either may win) and finishes the failover, and at
no moment do two processes hold the Lease. The handover time is printed (run with -s):

    testbed/cluster.sh exec .venv/bin/python -m pytest -s -p no:cacheprovider tests/e2e/test_k8s_operator_ha.py

Then a graceful stop (`kubectl delete pod`): the leader releases the Lease as it exits, and a standby
takes it at its next try instead of waiting for the Lease to expire.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request

import pytest
from support.waiting import wait_until
from operator_env import (
    OPERATOR_NAMESPACE, broker_info, brokers_report, events_for, start_operator, txbroker, wait_broker,
)

pytestmark = pytest.mark.e2e

ACQUIRED = re.compile(r"leader election: (\S+) acquired the Lease")


@pytest.fixture(scope="module")
def operator(crds, worker_id):
    yield from start_operator(crds, f"txbroker-ha-{worker_id}")


class LeaseWatch:
    """Every version of the operator's Lease, as `kubectl get -w` streams them, with the time each
    arrived (this machine's clock, the node's too)."""

    def __init__(self, tb, name: str):
        self.name, self.seen = name, []       # [(arrived, spec)]
        self.proc = subprocess.Popen(
            [str(tb.bin / "kubectl"), "get", "lease", name, "-n", OPERATOR_NAMESPACE, "-w", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=tb.env())
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        decoder, buf = json.JSONDecoder(), ""
        for line in self.proc.stdout:
            buf += line
            while buf.strip():
                try:
                    obj, end = decoder.raw_decode(buf.lstrip())
                except ValueError:
                    break
                buf = buf.lstrip()[end:]
                self.seen.append((time.time(), obj.get("spec") or {}))

    def holder(self) -> str:
        return self.seen[-1][1].get("holderIdentity", "") if self.seen else ""

    def holders(self) -> list[str]:
        """The holders in the order they held it (a release, no holder, shows as "")."""
        out = []
        for _, spec in self.seen:
            h = spec.get("holderIdentity", "")
            if not out or out[-1] != h:
                out.append(h)
        return out

    def first_seen(self, holder: str) -> float:
        return next(t for t, spec in self.seen if spec.get("holderIdentity") == holder)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def pod_of(identity: str) -> str:
    return identity.rsplit("_", 1)[0]


def parse_time(ts: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def leader_gauge(tb, pod: str) -> float:
    """txbroker_operator_leader as the pod's metrics endpoint (8081) says it: a standby serves it too."""
    ip = tb.get("pod", pod, OPERATOR_NAMESPACE)["status"]["podIP"]
    with urllib.request.urlopen(f"http://{ip}:8081/metrics", timeout=5) as r:
        text = r.read().decode()
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith("txbroker_operator_leader "))


def reporter(event: dict) -> str:
    return event.get("reportingInstance") or (event.get("source") or {}).get("host", "")


def test_another_operator_finishes_a_failover_its_killed_leader_started(operator):
    tb, namespace = operator.testbed, operator.namespace
    lease_name = f"{operator.deployment}-leader"
    pods = sorted(p["metadata"]["name"] for p in operator.pods())
    assert len(pods) == 2, f"the chart's default: two operator replicas; got {pods}"
    lease = wait_until(lambda: (l := tb.get("lease", lease_name, OPERATOR_NAMESPACE)) and
                       l["spec"].get("holderIdentity") and l, 60, "an operator to hold the Lease")
    leader_id = lease["spec"]["holderIdentity"]
    leader = pod_of(leader_id)
    (standby,) = set(pods) - {leader}
    duration = lease["spec"]["leaseDurationSeconds"]
    wait_until(lambda: (leader_gauge(tb, leader), leader_gauge(tb, standby)) == (1, 0), 60,
               "txbroker_operator_leader 1 on the leader, 0 on the standby")
    watch = LeaseWatch(tb, lease_name)
    try:
        tb.apply(txbroker("ha", replicas=2, replication="SYNC", flush="SYNC", failover={"gracePeriodSeconds": 5}),
                 namespace)
        wait_broker(operator, namespace, "ha")
        wait_until(lambda: all(b.get("inSync") for b in tb.get("txb", "ha", namespace)["status"]["brokers"]
                             if b["role"] == "slave"), 60, "the slave in sync")
        epoch_before = tb.get("txb", "ha", namespace)["status"]["epoch"]

        def crash_master():
            # SIGKILL ha-0's broker whenever the kubelet restarts it: a crash-looping master
            try:
                tb.kill_pod("ha-0", namespace)
            except LookupError:
                pass

        def loss_noticed():
            crash_master()
            st = tb.get("txb", "ha", namespace)["status"]
            return st.get("masterUnavailableSince") and st
        # the leader starts the failover: it found the master lost and counts the grace period
        st = wait_until(loss_noticed, 60, "the leader to notice the lost master", interval=0.1)
        assert st["master"] == "ha-0", "the failover finished before the leader could be killed"
        tb.kill_pod(leader, OPERATOR_NAMESPACE)          # the active operator crashes (SIGKILL)
        killed_at = time.time()

        def promoted():
            crash_master()
            return tb.get("txb", "ha", namespace)["status"]["master"] != "ha-0"
        try:
            wait_until(promoted, 180, "another operator to finish the failover", interval=0.1)
        except TimeoutError:
            raise AssertionError("no failover after the leader's death; operator logs:\n"
                                 + operator.log.read_text()[-6000:] + "\n" + brokers_report(tb, namespace, "ha", 2))
        finished_at = time.time()
        new_holder = wait_until(lambda: (h := watch.holder()) and h != leader_id and h, 30, "the Lease's new holder")
        # Two contenders once the Lease expires: the standby and the killed leader's restarted
        # container (a new process, a new identity). Either may win, as with client-go's election;
        # what matters is that a live process other than the killed one took over and finished.
        successor = pod_of(new_holder)
        assert successor in pods, f"the Lease went to {new_holder}, not to one of the operator pods {pods}"
        waiting = standby if successor == leader else leader

        txb = tb.get("txb", "ha", namespace)
        assert txb["status"]["master"] == "ha-1" and txb["status"]["epoch"] > epoch_before
        assert txb["status"]["lastFailover"]["from"] == "ha-0"
        wait_until(lambda: broker_info(tb, namespace, "ha-1")["role"] == "master", 30, "ha-1 acting as master")
        # the new holder finished it: the FailedOver Event comes from its pod
        failed_over = [e for e in events_for(tb, namespace, "ha") if e["reason"] == "FailedOver"]
        assert failed_over and {reporter(e) for e in failed_over} == {successor}, failed_over

        # never two holders: the Lease went from the killed leader straight to its successor, which took
        # it only once it had expired (past the dead leader's renew deadline, when it would have stopped)
        assert watch.holders() == [leader_id, new_holder], watch.holders()
        last_renewal = max(parse_time(s["renewTime"]) for _, s in watch.seen if s.get("holderIdentity") == leader_id)
        taken = [s for _, s in watch.seen if s.get("holderIdentity") == new_holder][0]
        assert taken["leaseTransitions"] == lease["spec"].get("leaseTransitions", 0) + 1
        assert last_renewal <= killed_at < parse_time(taken["acquireTime"])
        # the renew deadline is shorter than the lease: a leader cut off (not dead) would have
        # stopped acting before this acquisition
        assert parse_time(taken["acquireTime"]) - last_renewal > 10
        # the operators' own logs: one "acquired" for the first leader and one for its successor; the
        # other contender waits as a standby
        acquired = ACQUIRED.findall(operator.log.read_text())
        assert sorted(acquired) == sorted([leader_id, new_holder]), acquired
        if successor == standby:
            wait_until(lambda: "standby" in tb.pod_log(leader, OPERATOR_NAMESPACE), 60,
                       "the restarted operator standing by")
        wait_until(lambda: (leader_gauge(tb, successor), leader_gauge(tb, waiting)) == (1, 0), 60,
                   "txbroker_operator_leader following the Lease")

        handover = watch.first_seen(new_holder) - killed_at
        print(f"\noperator handover (SIGKILL of the active operator, lease {duration}s, renew deadline 10s, "
              f"retry 2s): Lease holder changed {handover:.1f}s after the kill "
              f"(acquireTime - kill: {parse_time(taken['acquireTime']) - killed_at:.1f}s); the failover it had "
              f"started finished {finished_at - killed_at:.1f}s after the kill")

        # a graceful stop (a rolling update, a drain): the leader releases the Lease as it exits, and
        # the other replica takes it at its next try instead of waiting for the Lease to expire
        stopped_at = time.time()
        tb.kubectl("-n", OPERATOR_NAMESPACE, "delete", "pod", successor, "--wait=false")
        after = wait_until(lambda: (h := watch.holder()) and h not in ("", new_holder) and h, 90,
                           "a standby to take the released Lease")
        # the other replica, or the pod the Deployment starts in place of the deleted one
        assert pod_of(after) != successor, after
        assert watch.holders()[-3:] == [new_holder, "", after], (
            f"no release seen ({time.time() - stopped_at:.1f}s after the delete): {watch.holders()}; "
            f"operator logs:\n{operator.log.read_text()[-6000:]}")
        released = watch.first_seen(after) - stopped_at
        print(f"operator handover (graceful stop, Lease released): holder changed {released:.1f}s after "
              f"`kubectl delete pod`")
    finally:
        watch.close()
