"""One broker group's share of a TxBroker pass: its master's failover, its pods, its brokers' roles
and its rolling updates. A group is a master and its slaves with an epoch sequence of their own, so
everything here looks only at the group's pods and its own block of the status; one group failing
over, rolling or starting never touches another (reconcile.py runs one GroupPass per group).

Group g0's master, epoch and masterUnavailableSince are also the TxBroker's top-level status fields
(what everything read before there were groups); the other groups' live in status.groups only.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping

import kopf

from . import brokers, events, failover, kube, manifests, metrics, observe, restore, status, sync_set
from . import constants as c
from .failover import Blocked, Promote
from .observe import Member
from .scaling import ACTIVE

if TYPE_CHECKING:
    from .reconcile import Pass

# what a group's block keeps from pass to pass (decisions and what they rest on); the rest of the
# block (phase, readyBrokers, ...) is recomputed every pass
PERSISTED = ("masterUnavailableSince", "lastFailover", "drainRouteVersion", "undelivered", "undeliveredTopics",
             "pendingTransactions", "switchover", "lastSwitchover", "syncSet", "successorAt")
HANDOVER_TIMEOUT_MS = 5000   # a successor that has not caught up by then: the switchover is abandoned
_TOP_LEVEL_G0 = ("master", "epoch", "masterUnavailableSince")


def load_view(txb_status: Mapping[str, Any], index: int) -> dict[str, Any]:
    """A group's part of the status as failover reads it: master, epoch, masterUnavailableSince,
    lastFailover, what it decided about draining, and its brokers as last seen."""
    name = manifests.group_name(index)
    blocks = {b.get("name"): b for b in txb_status.get("groups") or []}
    view = {k: v for k, v in (blocks.get(name) or {}).items() if k in PERSISTED or k in ("master", "epoch")}
    if index == 0:   # the top-level fields are g0's (written together with its block; alone by older operators)
        view.update({k: txb_status[k] for k in _TOP_LEVEL_G0 if txb_status.get(k) is not None})
        if "groups" not in txb_status and txb_status.get("lastFailover"):
            view["lastFailover"] = txb_status["lastFailover"]
    view["brokers"] = [b for b in txb_status.get("brokers") or [] if b.get("group", "g0") == name]
    return view


class GroupPass:
    def __init__(self, parent: "Pass", index: int, state: str, view: dict[str, Any]):
        self.p = parent
        self.index, self.name, self.state = index, manifests.group_name(index), state
        self.view = view
        self.master = view.get("master") or manifests.pod_name(parent.name, 0, index)
        self.previous_master = self.master   # before any promotion this pass decides
        self.epoch = int(view.get("epoch") or 1)
        self.unavailable_since: float | None = None   # for the operator's metrics (reconcile aggregates)
        self.blocked_reason = ""

    # -- what the parent pass shares -------------------------------------------------------------

    @property
    def members(self) -> dict[str, Member]:
        return {n: m for n, m in self.p.members.items() if m.group == self.index}

    @property
    def spec(self) -> Mapping[str, Any]:
        return self.p.spec

    @property
    def log(self):
        return self.p.log

    def say(self, message: str) -> str:
        """An Event's or log's message, naming the group when the TxBroker has more than one."""
        return f"group {self.name}: {message}" if self.p.multi else message

    def event(self, type_: str, reason: str, message: str) -> None:
        events.post(self.p.body, type_, reason, self.say(message))

    def event_once(self, type_: str, reason: str, message: str) -> None:
        events.post_once(self.p.body, type_, reason, self.say(message), subject=self.name)

    def save_status(self, **fields: Any) -> None:
        """Write a decision before carrying it out (the next pass finishes what a crash interrupts)."""
        for k, v in fields.items():
            if v is None:
                self.view.pop(k, None)
            else:
                self.view[k] = v
        self.p.save_group(self, fields)

    def extra(self) -> dict[str, Any]:
        """The block's persisted fields (None: dropped), for the status written at the end of the pass."""
        out: dict[str, Any] = {k: self.view.get(k) for k in PERSISTED}
        if self.state == ACTIVE:   # counts and the draining route version mean something only while it drains
            out.update(drainRouteVersion=None, undelivered=None, undeliveredTopics=None, pendingTransactions=None)
        return out

    # -- failover --------------------------------------------------------------------------------

    def handle_lost_master(self) -> None:
        members = self.members
        current = members.get(self.master)
        why = failover.master_down_reason(members, self.master)
        if not why:
            self.view.pop("masterUnavailableSince", None)
            if current.refused:   # it answers: alive, but the operator's credentials or TLS are wrong
                self.event_once(events.WARNING, "AdminRefused", current.refused)
            if current.incompatible:  # it answers: alive, in a form this operator cannot read
                self.event_once(events.WARNING, "AdminIncompatible", current.incompatible)
            return
        if current is not None and current.deleting and current.alive_master:
            # its pod is being deleted (a drain's eviction, a delete) and its broker still serves (it
            # waits for a handover before it stops): a switchover now, not a failover later
            p = failover.decide_switchover(members, self.view, self.master,
                                           {m.name for m in members.values() if m.name != self.master},
                                           f"{self.master}'s pod is being deleted (evicted or deleted)")
            if p is not None:
                self.promote(p)
                return
        others = [m for m in members.values() if m.name != self.master]
        if not others:
            self.unavailable_since = self.p.looked_at
            return   # nothing to fail over to: the master's pod is (re)created as master
        last_seen = next((b for b in self.view.get("brokers") or [] if b.get("name") == self.master), {})
        if "offset" not in last_seen:
            return   # a new group whose master is still starting
        if not self.view.get("masterUnavailableSince"):
            if why == failover.NOT_READY and not last_seen.get("ready"):
                return   # it answers as master and has not been Ready yet: starting, not lost
            # since the look began: a master that did not answer then has not served since
            self.save_status(masterUnavailableSince=status.now(self.p.looked_at))
            self.log.warning("%s", self.say(f"master {self.master} is not serving ({why})"))
        since = status.parse_time(self.view["masterUnavailableSince"])
        down_for = time.time() - since
        decision = failover.decide_failover(self.spec, self.view, members, self.master, down_for)
        self.unavailable_since = since
        self.blocked_reason = decision.reason if isinstance(decision, Blocked) else ""
        if isinstance(decision, Promote):
            self.promote(decision)
        elif isinstance(decision, Blocked):
            self.event_once(events.WARNING, decision.reason, decision.message)

    def promote(self, p: Promote) -> None:
        """Record the decision; converge_roles() carries it out in this pass (and the next pass
        finishes what a crash of the operator interrupts)."""
        old = self.master
        since = self.view.get("masterUnavailableSince")
        self.master, self.epoch = p.successor, p.epoch
        fields: dict[str, Any] = {"master": p.successor, "epoch": p.epoch, "masterUnavailableSince": None}
        if p.reason == "FailedOver":
            fields["lastFailover"] = {"time": status.now(), "from": old, "to": p.successor, "epoch": p.epoch,
                                      "message": self.say(p.message)}
            fields["successorAt"] = p.position()   # should it go silent before it serves (failover.standing_in)
        else:   # planned: the old master hands over first (take_over), once this is recorded
            fields["switchover"] = {"from": old, "to": p.successor, "epoch": p.epoch, "message": self.say(p.message)}
        self.save_status(**fields)
        self.event(events.WARNING if p.reason == "FailedOver" else events.NORMAL, p.reason, p.message)
        self.converge_roles()
        metrics.failed_over(self.p.ns, self.p.name, p.reason, status.parse_time(since) if since else None)
        self.unavailable_since, self.blocked_reason = None, ""

    def report_incompatible(self) -> None:
        """Brokers of the group that refuse to replicate for their versions (a slave that cannot read
        what its master writes): an Event (the condition ReplicationCompatible says it too)."""
        refused = status.incompatible(self.members)
        if refused:
            self.event_once(events.WARNING, "ReplicationIncompatible",
                            "replication stopped (docs/upgrading.md): " + "; ".join(refused))

    # -- pods and roles --------------------------------------------------------------------------

    def create_missing_pods(self) -> None:
        members = self.members
        master = members.get(self.master)
        for i in range(self.p.replicas):
            pod_name = manifests.pod_name(self.p.name, i, self.index)
            if pod_name in members:
                continue
            if pod_name == self.master:
                if any(n != pod_name for n in members):
                    continue   # the master's pod is gone: failover first, then it returns as a slave
                # a new TxBroker's first master, with spec.restore: it starts from its backup (restore.py)
                pod = manifests.broker_pod(self.p.name, self.p.ns, self.spec, i, c.ROLE_MASTER, group=self.index,
                                           restore_from=restore.path_in_claim(self.spec, self.name)
                                           if restore.active(self.p.status) else None)
            elif master is not None and master.address:
                pod = manifests.broker_pod(self.p.name, self.p.ns, self.spec, i, c.ROLE_SLAVE, master.address,
                                           group=self.index)
            else:
                continue   # slaves start once the master has an address to replicate from
            kopf.adopt(pod, owner=self.p.body)
            if kube.create_if_absent(pod):
                self.log.info("created pod %s (%s)", pod_name, pod["metadata"]["labels"][c.LABEL_ROLE])

    def converge_roles(self) -> None:
        """Labels and annotations follow the group's master; then the brokers' roles do."""
        members = self.members
        self.label_pods()
        head = members.get(self.master)
        access = self.p.access
        try:
            if head is not None and head.info is not None and not head.info.is_master and not head.deleting:
                wanted = head.name
                head = self.take_over(head)
                if self.master != wanted:
                    self.label_pods()   # another master after all (a switchover abandoned): labels follow
            if head is not None and head.alive_master and head.address:
                if head.info.unconfirmed:   # started again as master: it is, by the status
                    access.confirm(head.ip, head.info.epoch, sorted(sync_set.saved(self.view, head.info.epoch)))
                    head.info = access.info(head.ip)   # its sync set as confirmed (keep reads it below)
                    self.log.info("%s", self.say(f"{head.name} started again as master at epoch "
                                                 f"{head.info.epoch}: confirmed"))
                for m in members.values():
                    if m is not head and m.info is not None and not m.deleting and \
                            (m.info.is_master or m.info.master != head.address):
                        if m.info.is_master:
                            self.event(events.WARNING, "Fenced",
                                       f"{m.name} acted as master at epoch {m.info.epoch}; demoted to a "
                                       f"slave of {head.name} (epoch {head.info.epoch})")
                        access.demote(m.ip, head.address, max(self.epoch, head.info.epoch))
                        m.info = access.try_info(m.ip)
                        self.log.info("broker %s now follows %s", m.name, head.address)
                approved = sync_set.keep(self.view, head, lambda s: self.save_status(syncSet=s),
                                         lambda epoch, slaves: access.put_sync_set(head.ip, epoch, slaves))
                if approved:
                    self.log.info("master %s now counts %s for SYNC writes (its sync set, epoch %d)",
                                  head.name, ", ".join(approved), head.info.epoch)
        except (brokers.Unreachable, brokers.BrokerError) as e:
            self.log.warning("%s", self.say(f"could not set broker roles (the next pass retries): {e}"))

    def label_pods(self) -> None:
        """Each pod's role label and master annotation as the group's master says."""
        members = self.members
        head = members.get(self.master)
        # the master label is taken away before it is given: never two pods of a group behind <name>-master
        for m in sorted(members.values(), key=lambda m: m.name == self.master):
            if m.deleting:
                continue
            role = failover.role_for(m.name, self.master)
            address = "" if role == c.ROLE_MASTER else (head.address if head and head.address
                                                        else m.master_annotation)
            unlabelled = m.pod["metadata"].get("labels", {}).get(c.LABEL_GROUP) is None   # made before groups
            if m.label_role != role or m.master_annotation != address or unlabelled:
                kube.merge_patch("Pod", self.p.ns, m.name, {"metadata": {
                    "labels": {c.LABEL_ROLE: role, c.LABEL_GROUP: self.name},
                    "annotations": {c.ANNOTATION_MASTER: address}}})
                self.log.info("pod %s labelled %s%s", m.name, role, f" of {address}" if address else "")
                m.pod["metadata"].setdefault("labels", {})[c.LABEL_ROLE] = role
                m.pod["metadata"].setdefault("annotations", {})[c.ANNOTATION_MASTER] = address

    def hand_over(self, head: Member) -> Member | None:
        """A planned switchover to `head` (status.groups[].switchover records it): the old master
        takes no write until `head` holds its log to the end, then follows it (POST /api/v1/handover),
        so the old master is fenced only once the new one has everything. None: the switchover is
        off (the successor did not catch up in time, or the old master refused): the old master
        serves on and is the group's master again. `head` when the old master already follows it,
        cannot hand over (a broker before 0.2.0: fenced first, as a failover does) or is gone."""
        sw = self.view.get("switchover") or {}
        if sw.get("to") != head.name:
            return head
        old = self.p.members.get(sw.get("from", ""))
        if old is None or old.info is None or not old.info.is_master or not old.ip:
            return head
        access = self.p.access
        try:
            done = access.handover(old.ip, head.name, self.epoch, HANDOVER_TIMEOUT_MS)
            self.log.info("%s", self.say(f"{old.name} handed over to {head.name} at offset {done.offset}"))
            old.info = access.try_info(old.ip)
            return head
        except brokers.NoHandover as e:
            self.event_once(events.NORMAL, "Switchover", f"{old.name} cannot hand over ({e}): fenced before "
                                                         f"{head.name} is promoted, as in a failover")
            return head
        except brokers.BrokerError as e:
            why = str(e)
        now = access.try_info(old.ip)   # a refusal, or it stopped answering: what is it now?
        if now is not None and not now.is_master and now.master == head.address:
            old.info = now
            return head
        if now is None or not now.is_master:
            raise brokers.Unreachable(f"{old.name} did not answer the handover to {head.name}: {why}")
        self.master = old.name
        self.save_status(master=old.name, switchover=None)
        self.event(events.WARNING, "SwitchoverFailed",
                   f"switchover from {old.name} to {head.name} abandoned, {old.name} stays master: {why}")
        return None

    def take_over(self, head: Member) -> Member:
        """Make `head` master. A planned switchover first has the old master hand over (hand_over).
        Every other broker of the group that answers is turned into its follower first (the old
        master fenced, the slaves no longer following it), so nothing is acknowledged after this
        point that the new master lacks; then, since every acknowledged write is on the most
        caught-up slave, that one is promoted if `head` is behind it."""
        members, access = self.members, self.p.access
        if self.hand_over(head) is None:
            return members[self.master]
        deposed = {self.previous_master}
        chosen = head.info
        for m in failover.fence_before_promotion(members, head.name):
            if m.alive_master:
                deposed.add(m.name)
            if m.info.master == head.address and not m.info.is_master:
                continue   # follows it already (the old master that handed over)
            access.demote(m.ip, head.address, self.epoch)
            self.log.info("%s follows %s (epoch %d) before %s is promoted", m.name, head.name, self.epoch,
                          head.name)
        for m in members.values():
            if not m.deleting:
                m.info = access.try_info(m.ip)
        best = failover.successor_after_fencing(members, head, chosen, deposed)
        if best is None:
            raise brokers.Unreachable(f"{head.name} does not answer now that the others follow it, and none that "
                                      "answers is as far as it was: it is promoted when it answers")
        if best is not head:
            now = head.info or chosen
            self.log.warning("%s is ahead of %s (epoch %d offset %d > epoch %d offset %d): promoting it instead",
                             best.name, head.name, best.info.epoch, best.info.log_end_offset, now.epoch,
                             now.log_end_offset)
            self.master = best.name
            self.save_status(master=best.name)
            head = best
        epoch = self.epoch
        if head.info.epoch >= epoch:   # it has seen our epoch already (e.g. fenced): take a fresh one
            epoch = observe.highest_epoch(members, self.view) + 1
            self.epoch = epoch
            self.save_status(epoch=epoch)
        counted = sync_set.before_promotion(members, head)
        self.save_status(syncSet={"epoch": epoch, "slaves": counted})
        head.info = access.promote(head.ip, epoch, counted)
        self.log.info("broker %s promoted to master at epoch %d", head.name, epoch)
        sw = self.view.get("switchover")
        if sw:
            self.save_status(switchover=None, lastSwitchover={**sw, "to": head.name, "epoch": epoch,
                                                              "time": status.now()})
        return head

    # -- one disruptive step ---------------------------------------------------------------------

    def one_disruptive_step(self) -> None:
        """At most one pod of the group taken down per pass: a surplus one, or one built from an older
        spec (slaves first; the master only after a switchover). A draining group is left as it is:
        it is going away."""
        if self.state != ACTIVE:
            return
        members = list(self.members.values())
        if any(m.deleting for m in members):
            return
        master = self.members.get(self.master)
        if master is None or not master.alive_master:
            return
        replicas = self.p.replicas
        surplus = sorted((m for m in members if m.index >= replicas), key=lambda m: -m.index)
        if surplus:
            self.remove(surplus[0], "ScaledDown", f"replicas is {replicas}: removing {surplus[0].name}",
                        keep={m.name for m in members if m.index < replicas})
            return
        if len(members) < replicas or not all(m.ready for m in members):
            return
        want = manifests.pod_spec_hash(self.spec)
        outdated = sorted((m for m in members if m.spec_hash != want), key=lambda m: (m.name == self.master, -m.index))
        if not outdated:
            return
        target = outdated[0]
        if len(members) == 1 and not self.spec.get("storage"):
            self.event_once(events.WARNING, "UpdateBlocked",
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
        members = self.members
        if target.name == self.master and len(members) > 1:
            p = failover.decide_switchover(members, self.view, self.master, keep,
                                           f"{target.name} is to be replaced")
            if p is not None:
                self.promote(p)   # the old master's pod goes in a later pass, as a slave
            return
        self.event(events.NORMAL, reason, message)
        kube.delete_pod(self.p.ns, target.name)

