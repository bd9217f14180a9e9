"""One level-triggered pass over a TxBroker: make the world match its spec and status, one step at a time.

Called from Kopf's TxBroker handlers, on every event of one of its pods, and by the periodic health
pass (health.py). Passes for one TxBroker never overlap (a lock per TxBroker), and each starts from a
fresh read of the resource, so a pass always sees the master and epoch the previous one recorded.

A pass:
1. creates what is missing (ServiceAccount, Services, ConfigMap, PodDisruptionBudget, PVCs, pods) and
   puts back what drifted from what it builds (drift.py); a lone broker has no PodDisruptionBudget;
2. looks at every pod and asks its broker for role, epoch and log offset (observe.py);
3. fails over when the master has been lost past the grace period (failover.py): the decision is
   written to status first, then carried out, so a crash of the operator mid-way is finished by the
   next pass;
4. converges roles: the master's pod is labelled master (the `<name>-master` Service follows the
   label) and its broker is master at the status epoch; every other broker is a slave of it; a
   returning old master is demoted (fenced) here;
5. applies live settings (transaction defaults) to brokers that do not have them yet;
6. takes at most one disruptive step: remove a surplus pod, or replace one pod built from an older
   spec (slaves first; the master only after a switchover);
7. writes status.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any, Mapping

import kopf

from . import brokers, drift, events, failover, kube, manifests, metrics, observe, producer_groups, security, status
from . import constants as c
from .failover import Blocked, Promote
from .observe import Member

Logger = logging.Logger | logging.LoggerAdapter

_locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
_locks_guard = threading.Lock()
_applied_tx: dict[str, dict] = {}      # pod uid -> transaction defaults last pushed to its broker


def sync(body: Mapping[str, Any], logger: Logger) -> dict:
    """Run one pass for the TxBroker `body` names (re-read fresh under its lock); return its status."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    with _locks_guard:
        lock = _locks[(ns, name)]
    with lock:
        fresh = kube.get_txbroker(ns, name)
        if fresh is None or fresh["metadata"].get("deletionTimestamp"):
            return {}
        t0, ok = time.monotonic(), False
        try:
            result = Pass(fresh, logger).run()
            ok = True
            last = (result or {}).get("lastFailover") or (fresh.get("status") or {}).get("lastFailover")
            if last and last.get("time"):
                metrics.last_failover(ns, name, _parse_time(last["time"]))
            return result
        finally:
            metrics.passed(ns, name, time.monotonic() - t0, ok)


def _parse_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


class Pass:
    def __init__(self, body: dict, logger: Logger):
        self.body = body
        self.log = logger
        self.meta, self.spec = body["metadata"], body.get("spec") or {}
        self.name, self.ns = self.meta["name"], self.meta["namespace"]
        self.replicas = int(self.spec.get("replicas", 1))
        self.status: dict[str, Any] = dict(body.get("status") or {})
        self.master = failover.master_of(self.status, self.name)
        self.previous_master = self.master   # before any promotion this pass decides
        self.epoch = int(self.status.get("epoch") or 1)
        self.members: dict[str, Member] = {}
        self.looked_at = time.time()  # when the last look that asked the brokers began
        self.access = brokers.PLAIN
        self.secret_problem = ""

    # -- the pass --------------------------------------------------------------------------------

    def run(self) -> dict:
        self.ensure_children()
        try:
            self.access = security.access_for(self.body)
        except security.SecretProblem as e:
            # Without its credentials the operator cannot tell a dead master from a refusing one:
            # it creates and reports, and changes no broker's role until the Secret is fixed.
            self.secret_problem = str(e)
            events.post_once(self.body, events.WARNING, "SecretInvalid", self.secret_problem)
            self.create_missing_pods()
            self.look(ask_brokers=False)
            return self.write_status()
        self.look()
        self.handle_lost_master()
        self.create_missing_pods()
        self.converge_roles()
        self.apply_live_settings()
        producer_groups.remove_orphans(self.ns, self.name, self.members, self.access, self.log)
        self.one_disruptive_step()
        self.look(ask_brokers=False)
        return self.write_status()

    def look(self, ask_brokers: bool = True) -> None:
        pods = kube.list_pods(self.ns, manifests.selector_labels(self.name))
        old = self.members
        if ask_brokers:
            self.looked_at = time.time()
        self.members = observe.observe(pods, self.access, ask_brokers)
        if not ask_brokers:   # keep what the brokers said earlier in this pass
            for n, m in self.members.items():
                if n in old and old[n].pod["metadata"].get("uid") == m.pod["metadata"].get("uid"):
                    m.info, m.refused, m.incompatible = old[n].info, old[n].refused, old[n].incompatible

    # -- 1. children -----------------------------------------------------------------------------

    def ensure_children(self) -> None:
        for obj in (manifests.service_account(self.name, self.ns), manifests.headless_service(self.name, self.ns),
                    manifests.master_service(self.name, self.ns)):
            self.ensure_owned(obj)
        self.ensure_owned(manifests.config_map(self.name, self.ns, self.spec), drift_event=False)  # follows the spec
        if self.replicas > 1:
            self.ensure_owned(manifests.pod_disruption_budget(self.name, self.ns))
        else:   # a lone broker: a budget of one unavailable would not protect anything
            self.delete_owned("PodDisruptionBudget", self.name, f"replicas is {self.replicas}")
        self.ensure_network_policy()
        if self.spec.get("storage"):   # not owned: like a StatefulSet's, claims outlive the broker
            for i in range(self.replicas):
                pvc = manifests.data_pvc(self.name, self.ns, self.spec, i)
                if kube.create_if_absent(pvc):
                    self.log.info("created PersistentVolumeClaim %s", pvc["metadata"]["name"])

    def ensure_owned(self, obj: dict, drift_event: bool = True) -> None:
        """Create `obj` owned by the TxBroker, or put back what drifted from it (drift.py says what
        is compared). A repair of someone's edit is an Event; a ConfigMap following the spec is not."""
        kopf.adopt(obj, owner=self.body)
        kind, name = obj["kind"], obj["metadata"]["name"]
        current = kube.get(kind, self.ns, name)
        if current is None:
            if kube.create_if_absent(obj):
                self.log.info("created %s %s", kind, name)
            return
        patch = drift.repair(current, obj)
        if not patch:
            return
        kube.merge_patch(kind, self.ns, name, patch)
        if drift_event:   # someone edited what the operator owns: say what was put back
            metrics.drift_repaired(kind)
            events.post(self.body, events.NORMAL, "Repaired",
                        f"{kind} {name} differed from what {self.name} needs ({drift.what(patch)}); put back")
        else:
            self.log.info("updated %s %s (%s)", kind, name, drift.what(patch))

    def delete_owned(self, kind: str, name: str, why: str) -> None:
        current = kube.get(kind, self.ns, name)
        uid = self.meta.get("uid")
        if current is not None and any(r.get("uid") == uid for r in current["metadata"].get("ownerReferences") or []):
            kube.delete(kind, self.ns, name)
            self.log.info("deleted %s %s (%s)", kind, name, why)

    def ensure_network_policy(self) -> None:
        if (self.spec.get("networkPolicy") or {}).get("enabled", False):
            self.ensure_owned(manifests.network_policy(self.name, self.ns, self.spec, kube.own_namespace()),
                              drift_event=False)
        else:
            self.delete_owned("NetworkPolicy", self.name, "spec.networkPolicy.enabled is false")

    # -- 3. failover -----------------------------------------------------------------------------

    def handle_lost_master(self) -> None:
        current = self.members.get(self.master)
        why = failover.master_down_reason(self.members, self.master)
        if not why:
            self.status.pop("masterUnavailableSince", None)
            metrics.master_state(self.ns, self.name, None)
            if current.refused:   # it answers: alive, but the operator's credentials or TLS are wrong
                events.post_once(self.body, events.WARNING, "AdminRefused", current.refused)
            if current.incompatible:  # it answers: alive, in a form this operator cannot read
                events.post_once(self.body, events.WARNING, "AdminIncompatible", current.incompatible)
            return
        others = [m for m in self.members.values() if m.name != self.master]
        if not others:
            metrics.master_state(self.ns, self.name, self.looked_at)
            return   # nothing to fail over to: the master's pod is (re)created as master
        last_seen = next((b for b in self.status.get("brokers") or [] if b.get("name") == self.master), {})
        if "offset" not in last_seen:
            return   # a new TxBroker whose master is still starting
        if not self.status.get("masterUnavailableSince"):
            if why == failover.NOT_READY and not last_seen.get("ready"):
                return   # it answers as master and has not been Ready yet: starting, not lost
            # since the look began: a master that did not answer then has not served since
            self.status["masterUnavailableSince"] = status.now(self.looked_at)
            self.save_status(masterUnavailableSince=self.status["masterUnavailableSince"])
            self.log.warning("master %s is not serving (%s)", self.master, why)
        down_for = time.time() - _parse_time(self.status["masterUnavailableSince"])
        decision = failover.decide_failover(self.spec, self.status, self.members, self.master, down_for)
        since = _parse_time(self.status["masterUnavailableSince"])
        metrics.master_state(self.ns, self.name, since, decision.reason if isinstance(decision, Blocked) else "")
        if isinstance(decision, Promote):
            self.promote(decision)
        elif isinstance(decision, Blocked):
            events.post_once(self.body, events.WARNING, decision.reason, decision.message)

    def promote(self, p: Promote) -> None:
        """Record the decision; converge_roles() carries it out in this pass (and the next pass
        finishes what a crash of the operator interrupts)."""
        old = self.master
        since = self.status.get("masterUnavailableSince")
        self.master, self.epoch = p.successor, p.epoch
        self.status.update(master=p.successor, epoch=p.epoch)
        self.status.pop("masterUnavailableSince", None)
        if p.reason == "FailedOver":
            self.status["lastFailover"] = {"time": status.now(), "from": old, "to": p.successor,
                                           "epoch": p.epoch, "message": p.message}
        self.save_status(master=p.successor, epoch=p.epoch, masterUnavailableSince=None,
                         lastFailover=self.status.get("lastFailover"))
        events.post(self.body, events.WARNING if p.reason == "FailedOver" else events.NORMAL, p.reason, p.message)
        self.converge_roles()
        metrics.failed_over(self.ns, self.name, p.reason, _parse_time(since) if since else None)
        metrics.master_state(self.ns, self.name, None)

    # -- 4. pods and roles -----------------------------------------------------------------------

    def create_missing_pods(self) -> None:
        master = self.members.get(self.master)
        for i in range(self.replicas):
            pod_name = manifests.pod_name(self.name, i)
            if pod_name in self.members:
                continue
            if pod_name == self.master:
                if any(n != pod_name for n in self.members):
                    continue   # the master's pod is gone: failover first, then it returns as a slave
                pod = manifests.broker_pod(self.name, self.ns, self.spec, i, c.ROLE_MASTER)
            elif master is not None and master.address:
                pod = manifests.broker_pod(self.name, self.ns, self.spec, i, c.ROLE_SLAVE, master.address)
            else:
                continue   # slaves start once the master has an address to replicate from
            kopf.adopt(pod, owner=self.body)
            if kube.create_if_absent(pod):
                self.log.info("created pod %s (%s)", pod_name, pod["metadata"]["labels"][c.LABEL_ROLE])

    def converge_roles(self) -> None:
        """Labels and annotations follow status.master; then the brokers' roles do."""
        head = self.members.get(self.master)
        # the master label is taken away before it is given: never two pods behind <name>-master
        for m in sorted(self.members.values(), key=lambda m: m.name == self.master):
            if m.deleting:
                continue
            role = failover.role_for(m.name, self.master)
            address = "" if role == c.ROLE_MASTER else (head.address if head and head.address
                                                        else m.master_annotation)
            if m.label_role != role or m.master_annotation != address:
                kube.merge_patch("Pod", self.ns, m.name, {"metadata": {
                    "labels": {c.LABEL_ROLE: role}, "annotations": {c.ANNOTATION_MASTER: address}}})
                self.log.info("pod %s labelled %s%s", m.name, role, f" of {address}" if address else "")
        try:
            if head is not None and head.info is not None and not head.info.is_master and not head.deleting:
                head = self.take_over(head)
            if head is not None and head.alive_master and head.address:
                for m in self.members.values():
                    if m is not head and m.info is not None and not m.deleting and \
                            (m.info.is_master or m.info.master != head.address):
                        if m.info.is_master:
                            events.post(self.body, events.WARNING, "Fenced",
                                        f"{m.name} acted as master at epoch {m.info.epoch}; demoted to a "
                                        f"slave of {head.name} (epoch {head.info.epoch})")
                        self.access.demote(m.ip, head.address, max(self.epoch, head.info.epoch))
                        m.info = self.access.try_info(m.ip)
                        self.log.info("broker %s now follows %s", m.name, head.address)
        except (brokers.Unreachable, brokers.BrokerError) as e:
            self.log.warning("could not set broker roles (the next pass retries): %s", e)

    def take_over(self, head: Member) -> Member:
        """Make `head` master. Every other broker that answers is turned into its follower first
        (the old master fenced, the slaves no longer following it), so nothing is acknowledged after
        this point that the new master lacks; then, since every acknowledged write is on the most
        caught-up slave, that one is promoted if `head` is behind it."""
        deposed = {self.previous_master}
        for m in failover.fence_before_promotion(self.members, head.name):
            if m.alive_master:
                deposed.add(m.name)
            self.access.demote(m.ip, head.address, self.epoch)
            self.log.info("%s follows %s (epoch %d) before %s is promoted", m.name, head.name, self.epoch,
                          head.name)
        for m in self.members.values():
            if not m.deleting:
                m.info = self.access.try_info(m.ip)
        # a deposed master's extra records were never acknowledged (SYNC) or are knowingly lost (ASYNC)
        slaves = [m for m in self.members.values() if m.info is not None and not m.deleting
                  and (m is head or m.name not in deposed)]
        best = max(slaves, key=lambda m: (m.info.log_end_offset, m is head, -m.index))
        if best is not head:
            self.log.warning("%s is ahead of %s (offset %d > %d): promoting it instead", best.name, head.name,
                             best.info.log_end_offset, head.info.log_end_offset)
            self.master = best.name
            self.status["master"] = best.name
            self.save_status(master=best.name)
            head = best
        epoch = self.epoch
        if head.info.epoch >= epoch:   # it has seen our epoch already (e.g. fenced): take a fresh one
            epoch = observe.highest_epoch(self.members, self.status) + 1
            self.epoch = self.status["epoch"] = epoch
            self.save_status(epoch=epoch)
        head.info = self.access.promote(head.ip, epoch)
        self.log.info("broker %s promoted to master at epoch %d", head.name, epoch)
        return head

    # -- 5. live settings ------------------------------------------------------------------------

    def apply_live_settings(self) -> None:
        want = manifests.transaction_settings(self.spec)
        for m in self.members.values():
            uid = m.pod["metadata"].get("uid", "")
            if m.info is None or _applied_tx.get(uid) == want:
                continue
            try:
                self.access.put_transaction_defaults(m.ip, want)
                _applied_tx[uid] = want
            except (brokers.Unreachable, brokers.BrokerError) as e:
                self.log.warning("could not apply transaction defaults to %s: %s", m.name, e)

    # -- 6. one disruptive step ------------------------------------------------------------------

    def one_disruptive_step(self) -> None:
        members = [m for m in self.members.values()]
        if any(m.deleting for m in members):
            return
        master = self.members.get(self.master)
        if master is None or not master.alive_master:
            return
        surplus = sorted((m for m in members if m.index >= self.replicas), key=lambda m: -m.index)
        if surplus:
            self.remove(surplus[0], "ScaledDown", f"replicas is {self.replicas}: removing {surplus[0].name}",
                        keep={m.name for m in members if m.index < self.replicas})
            return
        if len(members) < self.replicas or not all(m.ready for m in members):
            return
        want = manifests.pod_spec_hash(self.spec)
        outdated = sorted((m for m in members if m.spec_hash != want), key=lambda m: (m.name == self.master, -m.index))
        if not outdated:
            return
        target = outdated[0]
        if len(members) == 1 and not self.spec.get("storage"):
            events.post_once(self.body, events.WARNING, "UpdateBlocked",
                             f"{target.name} is the only broker and keeps its data in an emptyDir: replacing it "
                             "would lose every message. Add a slave (replicas: 2) or storage, and it rolls.")
            return
        if self.spec.get("replication") == "SYNC":
            others = [m for m in members if m.name not in (self.master, target.name)]
            if not all(observe.in_sync(master, m) for m in others):
                return   # do not take a replica away while another one is still catching up
        done = len(members) - len(outdated)
        self.remove(target, "RollingUpdate", f"replacing {target.name} with the new spec "
                                             f"({done + 1} of {len(members)})",
                    keep={m.name for m in members if m.spec_hash == want})

    def remove(self, target: Member, reason: str, message: str, keep: set[str]) -> None:
        if target.name == self.master and len(self.members) > 1:
            p = failover.decide_switchover(self.members, self.status, self.master, keep,
                                           f"{target.name} is to be replaced")
            if p is not None:
                self.promote(p)   # the old master's pod goes in a later pass, as a slave
            return
        events.post(self.body, events.NORMAL, reason, message)
        kube.delete_pod(self.ns, target.name)

    # -- 7. status -------------------------------------------------------------------------------

    def save_status(self, **fields: Any) -> None:
        kube.patch_txbroker_status(self.ns, self.name, fields)

    def write_status(self) -> dict:
        extra = {k: self.status.get(k) for k in ("masterUnavailableSince", "lastFailover")}
        new = status.compute(self.body, self.members, self.master, self.epoch, extra)
        old = self.body.get("status") or {}
        changed = {k: v for k, v in new.items() if old.get(k) != v}
        if changed:
            kube.patch_txbroker_status(self.ns, self.name, changed)
        return new
