"""One level-triggered pass over a TxBroker: make the world match its spec and status, one step at a time.

Called from Kopf's TxBroker handlers, on every event of one of its pods, and by the periodic health
pass (health.py). Passes for one TxBroker never overlap (a lock per TxBroker), and each starts from a
fresh read of the resource, so a pass always sees the masters and epochs the previous one recorded.

A TxBroker has spec.groups broker groups (scaling.py), each a master and its slaves with its own
epochs; the steps marked (per group) run for each group on its own pods (broker_group.py), so one
group's failover or rolling update never touches another. A pass:
1. creates what is missing (ServiceAccount, Services, ConfigMap, PodDisruptionBudget, PVCs) and
   puts back what drifted from what it builds (drift.py); a lone broker has no PodDisruptionBudget;
2. looks at every pod and asks its broker for role, epoch and log offset (observe.py), and sees which
   groups are in play: active, draining (past spec.groups) or being removed;
3. writes the cluster route (`<name>-route`, route.py) when the groups or their brokers changed, at
   a higher version;
4. (per group) fails over when the group's master has been lost past the grace period (failover.py):
   the decision is written to status first, then carried out, so a crash of the operator mid-way is
   finished by the next pass;
5. (per group) creates missing pods and converges roles: the master's pod is labelled master (the
   `<name>-master` Service follows the label) and its broker is master at the group's epoch; every
   other broker of the group is a slave of it; a returning old master is demoted (fenced) here;
6. applies live settings (transaction defaults) to brokers that do not have them yet;
7. (per group) takes at most one disruptive step: remove a surplus pod, or replace one pod built
   from an older spec (slaves first; the master only after a switchover);
8. scales down: a draining group is removed once its master says it is drained (or when forced),
   else the condition ScaleDownBlocked says why;
9. writes status.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any, Mapping

import kopf

from . import (
    brokers, drift, events, failover, kube, manifests, metrics, observe, producer_groups, restore, route, scaling, security,
    status,
)
from . import constants as c
from .broker_group import GroupPass, load_view
from .observe import Member
from .scaling import ACTIVE, DRAINING, REMOVING

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
                metrics.last_failover(ns, name, status.parse_time(last["time"]))
            return result
        finally:
            metrics.passed(ns, name, time.monotonic() - t0, ok)


class Pass:
    def __init__(self, body: dict, logger: Logger):
        self.body = body
        self.log = logger
        self.meta, self.spec = body["metadata"], body.get("spec") or {}
        self.name, self.ns = self.meta["name"], self.meta["namespace"]
        self.replicas = int(self.spec.get("replicas", 1))
        self.wanted = scaling.wanted_groups(self.spec)
        self.status: dict[str, Any] = dict(body.get("status") or {})
        self.route_version = int(self.status.get("routeVersion") or 0)
        self.groups: dict[int, GroupPass] = {}
        self.members: dict[str, Member] = {}
        self.looked_at = time.time()  # when the last look that asked the brokers began
        self.access = brokers.PLAIN
        self.secret_problem = ""
        self.blocked: list[tuple[str, str, str]] = []   # (group, reason, message) of scale-downs waiting

    @property
    def multi(self) -> bool:
        """More than one broker group in play (Events and logs then name the group)."""
        return len(self.groups) > 1

    def serving(self) -> list[GroupPass]:
        """The groups whose brokers are kept running: active and draining ones."""
        return [g for _, g in sorted(self.groups.items()) if g.state != REMOVING]

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
            self.look(ask_brokers=False)
            self.restore_begin()
            self.plan_groups()
            self.ensure_route()
            for g in self.serving():
                g.create_missing_pods()
            self.look(ask_brokers=False)
            return self.write_status()
        self.look()
        self.restore_begin()
        self.plan_groups()
        self.ensure_group_children()
        self.ensure_route()
        for g in self.serving():
            g.handle_lost_master()
            g.create_missing_pods()
            g.converge_roles()
            g.report_incompatible()
        self.restore_progress()
        self.requested_switchovers()
        self.report_master_state()
        self.apply_live_settings()
        producer_groups.remove_orphans(self.ns, self.name, self.members, self.access, self.log)
        for g in self.serving():
            g.one_disruptive_step()
        self.scale_down()
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

    def plan_groups(self) -> None:
        blocks = {b.get("name"): b for b in self.status.get("groups") or []}
        states = scaling.plan(self.wanted, blocks, {m.group for m in self.members.values()})
        self.groups = {i: GroupPass(self, i, state, load_view(self.status, i)) for i, state in states.items()}

    # -- 1. children -----------------------------------------------------------------------------

    def ensure_children(self) -> None:
        for obj in (manifests.service_account(self.name, self.ns), manifests.headless_service(self.name, self.ns),
                    manifests.master_service(self.name, self.ns)):
            self.ensure_owned(obj)
        self.ensure_owned(manifests.config_map(self.name, self.ns, self.spec), drift_event=False)  # follows the spec
        self.ensure_network_policy()

    def ensure_group_children(self) -> None:
        """Per group kept running: its PodDisruptionBudget (one unavailable at a time, so a drain
        leaves the group a master and a slave: writable; a lone broker has none, it would protect
        nothing) and, with spec.storage, its claims. A group being removed loses its budget."""
        for g in sorted(self.groups.values(), key=lambda g: g.index):
            pdb = manifests.pdb_name(self.name, g.index)
            if g.state != REMOVING and self.replicas > 1:
                self.ensure_owned(manifests.pod_disruption_budget(self.name, self.ns, self.replicas, g.index))
            else:
                self.delete_owned("PodDisruptionBudget", pdb, f"replicas is {self.replicas}" if self.replicas <= 1
                                  else f"group {g.name} is being removed")
        for g in self.serving():
            if self.spec.get("storage"):   # not owned: like a StatefulSet's, claims outlive the broker
                for i in range(self.replicas):
                    pvc = manifests.data_pvc(self.name, self.ns, self.spec, i, g.index)
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

    # -- spec.restore (restore.py) ----------------------------------------------------------------

    def restore_begin(self) -> None:
        """At the first pass that sees spec.restore: a new TxBroker restores; one running refuses."""
        if not self.spec.get("restore") and self.status.get("restore"):
            self.save_status(restore=None)   # spec.restore removed: what was said of it goes too
            return
        decided = restore.begin(self.spec, self.status, bool(self.members), status.now())
        if decided is None:
            return
        self.save_status(restore=decided)
        if decided["phase"] == restore.REFUSED:
            events.post(self.body, events.WARNING, "RestoreRefused", decided["message"])
        else:
            events.post(self.body, events.NORMAL, "Restoring", f"from {decided['source']}: {decided['message']}")

    def restore_progress(self) -> None:
        """While restoring: a master's restore step that failed is said (its pod's broker never
        started); once every group's master serves, the restore is done."""
        if not restore.active(self.status):
            return
        serving = [g for g in self.serving() if g.state == ACTIVE]
        refused = [(g, restore.refusal(g.members.get(g.master))) for g in serving]
        refused = [(g, why) for g, why in refused if why]
        current = dict(self.status["restore"])
        said = "; ".join(g.say(f"{restore.source(self.spec, g.name)}: {why}") for g, why in refused)
        if said != current.get("refused", ""):
            if said:
                events.post(self.body, events.WARNING, "RestoreRefused", said)
            self.save_status(restore={**current, "refused": said or None})
            current["refused"] = said
        if serving and all(g.members.get(g.master) is not None and g.members[g.master].alive_master for g in serving):
            done = {"phase": restore.RESTORED, "time": status.now(), "refused": None,
                    "message": "; ".join(f"{g.name} from {restore.source(self.spec, g.name)}" for g in serving)}
            self.save_status(restore={**current, **done})
            events.post(self.body, events.NORMAL, "Restored", "restored: " + done["message"])

    # -- 3. the route ----------------------------------------------------------------------------

    def ensure_route(self) -> None:
        """The route ConfigMap lists every group kept running (a group being removed until its pods
        are gone, as draining), at a version raised on every change. Written before any pod of a
        new group is created, so its brokers start with a route that names their group."""
        listed = [route.group_route(self.name, self.ns, g.index, self.replicas,
                                    route.ACTIVE if g.state == ACTIVE else route.DRAINING)
                  for _, g in sorted(self.groups.items()) if g.state != REMOVING or g.members]
        want = route.body(self.name, listed)
        current = route.current(kube.get("ConfigMap", self.ns, manifests.route_config_map_name(self.name)))
        version = route.next_version(current, self.route_version, want)
        self.ensure_owned(manifests.route_config_map(self.name, self.ns, route.document(self.name, version, listed)),
                          drift_event=False)
        if version != self.route_version:
            self.log.info("cluster route version %d: %s", version,
                          ", ".join(f"{g['name']} ({g['state']})" for g in want["groups"]))
            self.route_version = version
            self.save_status(routeVersion=version)
        for g in self.groups.values():
            if g.state == DRAINING and not g.view.get("drainRouteVersion"):
                g.view["drainRouteVersion"] = version   # the first route that drains it

    # -- 4/5. failover and roles: broker_group.py ------------------------------------------------

    def requested_switchovers(self) -> None:
        """The annotation txbroker.dev/switchover: a switchover by hand, per broker group named (or
        to the pod named). Carried out through the same handover as a rolling update's; what is
        done or cannot be done is removed from the annotation (an Event says which and why), what
        waits for a slave to be in sync stays."""
        value = (self.meta.get("annotations") or {}).get(c.ANNOTATION_SWITCHOVER)
        if value is None:
            return
        serving = {g.name: g for g in self.serving() if g.state == ACTIVE}
        wanted, refused = failover.switchover_targets(value, {n: sorted(g.members) for n, g in serving.items()})
        for why in refused:
            events.post(self.body, events.WARNING, "SwitchoverRefused", f"{c.ANNOTATION_SWITCHOVER}: {why}")
        waiting = []
        for name, target in wanted.items():
            g = serving[name]
            if target == g.master:
                events.post(self.body, events.NORMAL, "Switchover", g.say(f"{target} is master already"))
                continue
            p = failover.decide_switchover(g.members, g.view, g.master,
                                           {target} if target else set(g.members) - {g.master},
                                           f"{c.ANNOTATION_SWITCHOVER} asked for it")
            if p is None:
                waiting.append(target or name)
                g.event_once(events.NORMAL, "SwitchoverWaiting",
                             f"{c.ANNOTATION_SWITCHOVER}: waiting for {target or 'a slave'} to be ready and in "
                             f"sync with master {g.master}")
                continue
            g.promote(p)
        remaining = ",".join(waiting) or None
        if remaining != value:
            kube.merge_patch(c.TXBROKER_KIND, self.ns, self.name,
                             {"metadata": {"annotations": {c.ANNOTATION_SWITCHOVER: remaining}}})
            self.meta.setdefault("annotations", {})[c.ANNOTATION_SWITCHOVER] = remaining

    def report_master_state(self) -> None:
        """The operator's master gauges are per TxBroker: unavailable while any group's master is."""
        downs = [g.unavailable_since for g in self.serving() if g.unavailable_since is not None]
        reasons = [g.blocked_reason for g in self.serving() if g.blocked_reason]
        metrics.master_state(self.ns, self.name, min(downs) if downs else None, reasons[0] if reasons else "")

    # -- 6. live settings ------------------------------------------------------------------------

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

    # -- 8. scaling down -------------------------------------------------------------------------

    def scale_down(self) -> None:
        force = scaling.forced(self.meta.get("annotations"))
        for _, g in sorted(self.groups.items()):
            if g.state == DRAINING:
                report, why = self.ask_drain(g)
                if report is not None:
                    g.view.update(undelivered=report.undelivered, pendingTransactions=report.pending_transactions,
                                  undeliveredTopics={t: n for t, n in report.topics.items() if n} or None)
                drain_version = int(g.view.get("drainRouteVersion") or self.route_version)
                waiting, waiting_why = (self.waiting_on(g, drain_version) if report is not None and report.drained
                                        else ({}, ""))
                decision = scaling.decide_removal(g.name, report, why, drain_version, force, waiting, waiting_why)
                if isinstance(decision, scaling.Wait):
                    self.blocked.append((g.name, decision.reason, decision.message))
                    if decision.reason != "RouteNotLoaded":   # that one passes within a kubelet sync: no Event
                        events.post_every(self.body, events.WARNING, "ScaleDownBlocked", decision.message,
                                          subject=f"{g.name}/{decision.reason}")
                    continue
                events.post(self.body, events.WARNING if decision.forced else events.NORMAL,
                            "ForcedScaleDown" if decision.forced else "GroupDrained", decision.message)
                g.state = REMOVING
                self.save_group(g, {})
            if g.state == REMOVING:
                self.remove_group(g)

    def ask_drain(self, g: GroupPass) -> tuple[scaling.DrainReport | None, str]:
        """What the draining group's master holds, with the route version it runs; (None, why) when
        it cannot be asked."""
        head = g.members.get(g.master)
        if head is None or not head.ip:
            return None, f"its master {g.master} has no pod"
        if not head.alive_master:
            return None, f"{g.master} does not answer as master"
        try:
            running = self.access.route_version(head.ip)
            drain = self.access.drain(head.ip)
        except (brokers.Unreachable, brokers.BrokerError, brokers.Incompatible) as e:
            return None, str(e)
        return scaling.DrainReport(undelivered=drain.undelivered, pending_transactions=drain.pending_transactions,
                                   drained=drain.drained, route_version=running, topics=drain.topics,
                                   undecided_jobs=drain.undecided_jobs,
                                   unreleased_jobs=drain.unreleased_jobs,
                                   unreleased_decisions=drain.unreleased_decisions), ""

    def waiting_on(self, g: GroupPass, drain_version: int) -> tuple[dict[str, int] | None, str]:
        """Per other group kept running, its participants whose decision lives on `g` (their masters'
        drain `waiting_on`); (None, why) when a master cannot be asked, or still runs a route before
        `drain_version` (until it loads it, it takes new work that waits on `g`, after any look)."""
        out: dict[str, int] = {}
        for other in self.serving():
            if other is g:
                continue
            head = other.members.get(other.master)
            if head is None or not head.ip or not head.alive_master:
                return None, f"{other.name}'s master {other.master} does not answer as master"
            try:
                running = self.access.route_version(head.ip)
                if running < drain_version:
                    return None, (f"{other.name}'s master runs route version {running}, before version "
                                  f"{drain_version} that drains {g.name}")
                out[other.name] = self.access.drain(head.ip).waiting_on.get(g.name, 0)
            except (brokers.Unreachable, brokers.BrokerError, brokers.Incompatible) as e:
                return None, str(e)
        return out, ""

    def remove_group(self, g: GroupPass) -> None:
        """Its pods first; its claims once no pod uses them; then it is gone (the next route leaves
        it out)."""
        members = g.members
        for m in members.values():
            if not m.deleting:
                kube.delete_pod(self.ns, m.name)
                self.log.info("deleted pod %s (group %s removed)", m.name, g.name)
        if members:
            return
        claims = kube.list_objects("PersistentVolumeClaim", self.ns, manifests.group_selector_labels(self.name, g.index))
        for pvc in claims:
            if not pvc["metadata"].get("deletionTimestamp"):
                kube.delete("PersistentVolumeClaim", self.ns, pvc["metadata"]["name"])
                self.log.info("deleted PersistentVolumeClaim %s (group %s removed)", pvc["metadata"]["name"], g.name)
        if claims:
            return
        del self.groups[g.index]
        events.post(self.body, events.NORMAL, "GroupRemoved", f"group {g.name} removed: its brokers and volumes "
                                                              "are gone")

    # -- 9. status -------------------------------------------------------------------------------

    def save_status(self, **fields: Any) -> None:
        self.status.update(fields)
        kube.patch_txbroker_status(self.ns, self.name, fields)

    def group_blocks(self) -> list[dict]:
        """status.groups as decided so far in this pass (the list is written whole: a merge patch
        replaces lists)."""
        old = {b.get("name"): b for b in self.status.get("groups") or []}
        out = []
        for _, g in sorted(self.groups.items()):
            block = {**(old.get(g.name) or {}), "name": g.name, "state": g.state, "master": g.master,
                     "epoch": g.epoch, **g.extra()}
            out.append({k: v for k, v in block.items() if v is not None})
        return out

    def save_group(self, g: GroupPass, fields: dict[str, Any]) -> None:
        """A group's decision, written at once: its block, and for g0 the top-level fields too."""
        blocks = self.group_blocks()
        patch: dict[str, Any] = {"groups": blocks}
        if g.index == 0:
            patch.update({k: v for k, v in fields.items() if k in ("master", "epoch", "masterUnavailableSince")})
        if fields.get("lastFailover"):
            patch["lastFailover"] = status.latest_failover(blocks, self.status.get("lastFailover"))
        self.status.update(patch)
        kube.patch_txbroker_status(self.ns, self.name, patch)

    def write_status(self) -> dict:
        reports = [status.GroupReport(i, g.members, g.master, g.epoch, g.state, g.extra())
                   for i, g in sorted(self.groups.items())]
        new = status.compute_groups(self.body, reports, {"routeVersion": self.route_version or None,
                                                         "restore": self.status.get("restore") or None}, self.blocked)
        old = self.body.get("status") or {}
        changed = {k: v for k, v in new.items() if old.get(k) != v}
        if changed:
            kube.patch_txbroker_status(self.ns, self.name, changed)
        return new
