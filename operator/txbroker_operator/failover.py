"""Pure decisions about who should be master: failover after a master is lost, and planned
switchover (before the master's pod is replaced or removed).

Rules (DESIGN.md, "Roles, replication, failover"):
- a master is lost when it has not served for longer than the grace period: serving means its pod
  is Ready AND its broker's admin API answers as master (down_reason); a pod that is gone, being
  deleted or not ready, a broker that does not answer, and a fenced or demoted one all count as lost
  (not Ready alone counts once the pod has been seen Ready: before that the master is starting);
- so does a SYNC master that answers but is cut off from its slaves: it acknowledges no write while
  slaves that answer replicate from nobody (cut_off_reason);
- the successor is the most caught-up slave (highest log end offset; lowest ordinal on a tie);
- under SYNC replication, only a slave the master last reported in sync while it could acknowledge
  writes (status `promotable`), or one in the sync set the status keeps for its epoch (every slave
  whose acknowledgements it could count: sync_set.py), may be promoted, unless
  spec.failover.allowOutOfSyncPromotion says otherwise: an out-of-sync slave may lack acknowledged
  commits (I1); and since a write is acknowledged once `syncReplicas` (k) slaves hold it, not all
  n in sync, a failover waits until n - k + 1 of them answer: one of those holds every
  acknowledged write, and the most caught-up is promoted (the fault harness, seed 16, promoted the
  one that answered first and lost what only the other held);
- when none was reported in sync but every other broker of the group answers, with what it
  acknowledged still on it (SYNC flush, persistent storage: `unaccounted`), the furthest at the
  newest epoch holds every acknowledged write (most_caught_up), in sync or not (the fault harness,
  seed 274: a group of two whose new master was lost before the old one, restarted, had followed
  it; a review: a slave whose pod was deleted leaves no entry, so the group is counted by replicas);
- the new epoch is above every epoch any broker or the status has seen, so no two masters ever
  share one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from . import constants as c, sync_set
from .observe import Member, acknowledging, caught_up, highest_epoch
from .status import promotable


@dataclass(frozen=True)
class Promote:
    successor: str
    epoch: int
    reason: str          # FailedOver | Switchover
    message: str
    at: tuple[int, int] = (0, 0)   # the successor's (log epoch, log end) when chosen

    def position(self) -> dict:
        """What the status keeps of a failover's choice until the successor serves (`standing_in`)."""
        return {"name": self.successor, "forEpoch": self.epoch, "epoch": self.at[0], "offset": self.at[1]}


@dataclass(frozen=True)
class Blocked:
    reason: str
    message: str


def settings(spec: Mapping[str, Any]) -> dict:
    f = spec.get("failover") or {}
    return {"enabled": f.get("enabled", True), "grace": float(f.get("gracePeriodSeconds", 10)),
            "allow_out_of_sync": bool(f.get("allowOutOfSyncPromotion", False))}


NOT_READY = "its pod is not ready"


def down_reason(m: Member | None) -> str:
    """Why the master does not count as serving, or "" when it does. An admin API that answers but
    refuses the operator's credentials counts as alive: the operator cannot tell, and a wrong Secret
    must not cause a failover; so does one whose answer it cannot read (a rolling upgrade that
    renamed a field must not either)."""
    if m is None:
        return "its pod is gone"
    if m.deleting:
        return "its pod is being deleted"
    if m.info is None and not m.refused and not m.incompatible:
        return "its admin API does not answer"
    if m.info is not None and not m.info.is_master:
        return f"its broker is {m.info.role}" + (f", fenced by epoch {m.info.fenced_by}" if m.info.fenced_by else "")
    if not m.ready:
        return NOT_READY
    return ""


def cut_off_reason(members: Mapping[str, Member], master: str) -> str:
    """Why a master that answers still serves no producer, or "". Under SYNC replication a master
    none of whose slaves can reach it (or it them) acknowledges no write; when enough slaves answer
    the operator and replicate from nobody, promoting one of them restores service (the fault
    harness held such partitions for their whole length before this). A slave that replicates but
    lags is slow, not cut off; a master whose slaves are down has nobody to hand over to. A slave
    that does not follow this master (a fenced old master following nobody) is not cut off from
    it: the pass points it at the master (counting it here blocked that pass for good)."""
    head = members.get(master)
    if head is None or head.info is None or not head.info.is_master or acknowledging(head):
        return ""
    cut = [m.name for m in candidates(members, master)
           if m.ready and not m.info.connected and m.info.master == head.address]
    if not cut or len(cut) < head.info.sync_replicas:
        return ""
    return (f"it acknowledges no write: SYNC replication needs {head.info.sync_replicas} slave(s) in sync, and "
            f"{', '.join(cut)} answer{'s' if len(cut) == 1 else ''} but replicate{'s' if len(cut) == 1 else ''} "
            "from nobody (cut off from it)")


def master_down_reason(members: Mapping[str, Member], master: str) -> str:
    """Why the master does not serve (gone, not answering, not master, cut off), or "" when it does."""
    return down_reason(members.get(master)) or cut_off_reason(members, master)


def candidates(members: Mapping[str, Member], master: str) -> list[Member]:
    """Slaves that answer, most caught-up first."""
    live = [m for m in members.values()
            if m.name != master and not m.deleting and m.info is not None and not m.info.is_master]
    return sorted(live, key=lambda m: (-m.info.log_end_offset, m.index))


def decide_failover(spec: Mapping[str, Any], status: Mapping[str, Any], members: Mapping[str, Member],
                    master: str, down_for: float) -> Promote | Blocked | None:
    """The master has not acted as master for `down_for` seconds: promote, wait, or say why not."""
    cfg = settings(spec)
    if not cfg["enabled"]:
        return Blocked("FailoverDisabled", f"master {master} is down and spec.failover.enabled is false")
    if down_for < cfg["grace"]:
        return None
    last_seen = {b["name"]: b for b in status.get("brokers") or []}
    if (last_seen.get(master) or {}).get("role") != c.ROLE_MASTER or "offset" not in last_seen[master]:
        return Blocked("MasterNeverServed", f"master {master} has not served yet; waiting for it (a new "
                                            "TxBroker, or one whose status was lost)")
    options = candidates(members, master)
    if not options:
        return Blocked("NoSuccessor", f"master {master} is down and no slave answers")
    chosen = status.get("successorAt") or {}
    chosen_never_served = (chosen.get("name") == master and chosen.get("forEpoch") == status.get("epoch")
                           and int(last_seen[master].get("epoch") or 0) < int(chosen["forEpoch"]))
    if spec.get("replication") == "SYNC" and not cfg["allow_out_of_sync"] and chosen_never_served:
        return standing_in(status, members, master, options, chosen)
    last_master_offset = (last_seen.get(master) or {}).get("offset")
    best = options[0]
    behind = f"; it may lack up to {last_master_offset - best.info.log_end_offset} records the master had" \
        if isinstance(last_master_offset, int) and last_master_offset > best.info.log_end_offset else ""
    if spec.get("replication") == "SYNC":
        # the set of the lost master's own epoch (an abandoned switchover leaves the status a step ahead)
        counted = (sync_set.saved(status, int(last_seen[master].get("epoch") or 0))
                   | sync_set.saved(status, int(status.get("epoch") or 0))) - {master}
        synced = [m for m in options if not (last_seen.get(m.name) or {}).get("lostRecords")
                  and (promotable(last_seen.get(m.name) or {}) or m.name in counted)]
        were = sorted({n for n, e in last_seen.items() if n != master and e.get("role") != c.ROLE_MASTER
                       and promotable(e)} | counted)
        need = len(were) - int((last_seen.get(master) or {}).get("syncReplicas") or 1) + 1
        silent = sorted(set(were) - {m.name for m in synced})
        if synced and len(synced) < need and not cfg["allow_out_of_sync"]:
            return Blocked("InSyncSlaveDown",
                           f"master {master} is down and {', '.join(silent)}, in sync with it, do"
                           f"{'es' if len(silent) == 1 else ''} not answer: SYNC replication acknowledged its last "
                           f"writes once {len(were) - need + 1} slave(s) held them, so they may be there only; waiting "
                           f"until {need - len(synced)} more answer(s). Set "
                           f"spec.failover.allowOutOfSyncPromotion: true to promote {synced[0].name} (offset "
                           f"{synced[0].info.log_end_offset}) anyway")
        if synced:
            best = most_caught_up(synced, None)
            behind = ""
        elif not cfg["allow_out_of_sync"]:
            unsure = unaccounted(spec, last_seen, members, master, options)
            if unsure:
                return Blocked("NoInSyncSlave",
                               f"master {master} is down and no slave was in sync (SYNC replication); {unsure}; "
                               f"the most caught-up is {best.name} at offset {best.info.log_end_offset}{behind}. "
                               "Set spec.failover.allowOutOfSyncPromotion: true to promote it anyway")
            best = most_caught_up(options, None)
            behind = (f"; no slave was in sync, but every other broker answers, and {best.name} is the furthest "
                      f"at the newest epoch ({best.info.epoch}): it holds every acknowledged write")
    epoch = highest_epoch(members, status) + 1
    return Promote(best.name, epoch, "FailedOver",
                   f"master {master} down for {down_for:.0f}s; promoted {best.name} (offset "
                   f"{best.info.log_end_offset}) at epoch {epoch}{behind}", (best.info.epoch, best.info.log_end_offset))


def standing_in(status: Mapping[str, Any], members: Mapping[str, Member], master: str, options: list[Member],
                chosen: Mapping[str, Any]) -> Promote | Blocked:
    """`master` was chosen to succeed a lost one for holding every acknowledged write, and went silent
    before it served (it never reached `chosen["forEpoch"]`). Only a slave at least as far as it was
    then holds all of that (at one epoch, a longer log holds a shorter one's records); else wait for
    it, however long (a fresh decision on the brokers that answer might pick one behind it)."""
    floor = (int(chosen["epoch"]), int(chosen["offset"]))
    able = [m for m in options if (m.info.epoch, m.info.log_end_offset) >= floor]
    if not able:
        return Blocked("SuccessorSilent", f"{master}, chosen to be master at epoch {chosen['forEpoch']} for holding "
                                          f"every acknowledged write (epoch {floor[0]}, offset {floor[1]}), does "
                                          "not answer, and no slave that answers is that far; waiting for it")
    best = most_caught_up(able, None)
    epoch = highest_epoch(members, status) + 1
    return Promote(best.name, epoch, "FailedOver",
                   f"{master}, chosen to be master, went silent before it served; promoted {best.name} (offset "
                   f"{best.info.log_end_offset}, as far as {master} was) at epoch {epoch}",
                   (best.info.epoch, best.info.log_end_offset))


def unaccounted(spec: Mapping[str, Any], last_seen: Mapping[str, Any], members: Mapping[str, Member],
                master: str, options: list[Member]) -> str:
    """Why the slaves that answer may not hold every acknowledged write between them, or "" when
    they must (most_caught_up then names the one holding all of it). Each of the group's other
    brokers must answer as a slave (one silent, deleted or not yet recreated may be the only one
    holding some write: counted by spec.replicas, since a deleted pod leaves no entry), and what a
    broker acknowledged must still be on it: on disk when acknowledged (SYNC flush: under ASYNC
    flush a power cut can take it) and kept when its pod is replaced (spec.storage: without it a
    new pod starts empty, or refills from the master it followed), and no slave's log may end before
    where it was last seen at its epoch (status `lostRecords`: a log cut short)."""
    silent = sorted(((set(last_seen) | set(members)) - {master}) - {m.name for m in options})
    if silent:
        return (f"{', '.join(silent)} do{'es' if len(silent) == 1 else ''} not answer as a slave and may hold "
                "acknowledged writes the others lack")
    others = int(spec.get("replicas") or 1) - 1
    if len(options) < others:
        return (f"{len(options)} of the group's {others} other brokers answer: one that does not may hold "
                "acknowledged writes the others lack")
    if spec.get("flush") != "SYNC":
        return "under ASYNC flush a power cut may have taken acknowledged writes from a slave that answers"
    lost = sorted(m.name for m in options if (last_seen.get(m.name) or {}).get("lostRecords"))
    if lost:
        return (f"{', '.join(lost)} lost records {'it' if len(lost) == 1 else 'they'} held (a log that ends before "
                "where it was seen, at the same epoch: cut short, or a power cut), so what it acknowledged may be gone")
    if not spec.get("storage"):
        return "without spec.storage a replaced pod answers without what it acknowledged"
    if most_caught_up(options, None).info.epoch < 1:   # none holds anything: nothing to vouch for
        return "every slave that answers has an empty store"
    return ""


def most_caught_up(brokers: list[Member], head: Member | None) -> Member:
    """The broker holding every acknowledged write among `brokers` (all answering): the furthest at
    the newest log epoch, then `head`, then the lowest ordinal. An epoch's master writes its epoch
    record first, so a broker at that epoch holds a prefix of that master's log, and SYNC replication
    acknowledges a write once a slave holds it: the furthest at the newest epoch holds all that epoch
    acknowledged, and (each promotion having picked such a broker) all acknowledged before it. Where
    none took the newest master's epoch, that master acknowledged nothing. A longer log at an older
    epoch is a deposed master's tail of records never acknowledged: promoting it for its length
    would drop what the newer epoch acknowledged. (Under ASYNC flush a slave's power loss can take
    what it acknowledged: that loss window is measured, docs/verification.md.)"""
    return max(brokers, key=lambda m: (m.info.epoch, m.info.log_end_offset, m is head, -m.index))


def fence_before_promotion(members: Mapping[str, Member], successor: str) -> list[Member]:
    """The brokers to turn into followers of `successor` (at the new epoch) before it is promoted:
    every other broker that answers, the old master and the slaves alike. A slave still following
    the old master would acknowledge its writes should it come back (a paused master resumes with
    client requests queued in its sockets), and under SYNC replication that acknowledgement is all
    it needs: writes acknowledged at the old epoch that the new master lacks (found by the fault
    harness, chaos/, seed 19). A broker that does not answer now is turned at the next pass. A pod
    being deleted is left to stop, unless its broker still acts as master: one told to stop serves
    on while it waits for a handover (a drain), and must not take writes beside the successor."""
    return [m for m in members.values()
            if m.name != successor and m.info is not None and (not m.deleting or m.info.is_master)]


def decide_switchover(members: Mapping[str, Member], status: Mapping[str, Any], master: str,
                      allowed: set[str], why: str) -> Promote | None:
    """Hand mastership to a caught-up slave among `allowed` (planned: the master is healthy)."""
    current = members.get(master)
    ready = [m for m in candidates(members, master) if m.name in allowed and m.ready and caught_up(current, m)]
    if current is None or not current.alive_master or not ready:
        return None
    best = ready[0]
    epoch = highest_epoch(members, status) + 1
    return Promote(best.name, epoch, "Switchover", f"{why}: master moves from {master} to {best.name} "
                                                   f"at epoch {epoch}")


def switchover_targets(value: str, groups: Mapping[str, list[str]]) -> tuple[dict[str, str], list[str]]:
    """What the annotation txbroker.dev/switchover asks for, given each broker group's pods:
    {group: the pod to make master, or "" for its most caught-up slave in sync}, and why each item
    that names neither a group nor a pod of this TxBroker is refused."""
    wanted: dict[str, str] = {}
    refused: list[str] = []
    owner = {pod: g for g, pods in groups.items() for pod in pods}
    for item in (x.strip() for x in value.split(",")):
        if not item:
            continue
        if item in groups:
            wanted.setdefault(item, "")
        elif item in owner:
            if wanted.get(owner[item]) not in (None, "", item):
                refused.append(f"{item}: group {owner[item]} is asked to switch over to {wanted[owner[item]]} already")
            else:
                wanted[owner[item]] = item
        else:
            refused.append(f"{item!r} is neither a broker group ({', '.join(sorted(groups))}) nor a broker pod "
                           f"of this TxBroker")
    return wanted, refused


def master_of(status: Mapping[str, Any], name: str) -> str:
    return status.get("master") or f"{name}-0"


def role_for(member_name: str, master: str) -> str:
    return c.ROLE_MASTER if member_name == master else c.ROLE_SLAVE


def successor_after_fencing(members: Mapping[str, Member], head: Member, chosen: Any,
                            deposed: set[str]) -> Member | None:
    """Whom to promote once every answering broker follows `head`, as they answer now (take_over);
    `chosen` is `head`'s info when it was chosen. The furthest at the newest epoch among `head` and
    the slaves that were not masters (a deposed master's tail was never acknowledged). If `head` no
    longer answers, it may be the only one holding some acknowledged write: another is promoted
    only if it is at least as far as `head` was when chosen, else nobody this pass (None)."""
    answering = [m for m in members.values() if m.info is not None and not m.deleting
                 and (m is head or m.name not in deposed)]
    if head.info is not None:
        return most_caught_up(answering, head)
    others = [m for m in answering if m is not head]
    if not others or chosen is None:
        return None
    best = most_caught_up(others, None)
    return best if (best.info.epoch, best.info.log_end_offset) >= (chosen.epoch, chosen.log_end_offset) else None
