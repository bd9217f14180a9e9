"""Pure: what the pods and brokers look like -> the TxBroker's status."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

from . import __version__, manifests, restore
from .observe import Member, acknowledging, in_sync


def now(at: float | None = None) -> str:
    """The time (`at`, seconds since the epoch, or now) as status and conditions write it."""
    t = datetime.now(timezone.utc) if at is None else datetime.fromtimestamp(at, timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    """A time as now() writes it, in seconds since the epoch."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def condition(type_: str, ok: bool, reason: str, message: str, old: list[dict], since: str | None = None) -> dict:
    """A condition; lastTransitionTime moves only when the status flips, unless `since` says when the
    state it reports began (FailedOver: each failover is a new transition, True to True)."""
    status = "True" if ok else "False"
    prev = next((x for x in old if x.get("type") == type_), None)
    if since is None:
        since = prev["lastTransitionTime"] if prev and prev.get("status") == status and prev.get("lastTransitionTime") \
            else now()
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}


def promotable(entry: Mapping[str, Any]) -> bool:
    """A status entry's slave may be promoted under SYNC replication (entries written before the
    field existed: their inSync)."""
    return bool(entry.get("promotable", entry.get("inSync")))


def lost_records(before: Mapping[str, Any], m: Member) -> bool:
    """`m`'s log ends before where its last-seen entry put it, at the same epoch."""
    return (m.info is not None and before.get("epoch") == m.info.epoch and isinstance(before.get("offset"), int)
            and m.info.log_end_offset < before["offset"])


def broker_entries(members: Mapping[str, Member], master: str, old: list[dict]) -> list[dict]:
    """Per broker: role, readiness, log position and (slaves) sync state. What cannot be seen now -
    a broker that does not answer, slaves' sync state while the master is down, the master whose pod
    was deleted - keeps the value last seen: failover decides on it."""
    last_seen = {b.get("name"): b for b in old}
    head = members.get(master)
    head_offset = head.info.log_end_offset if head and head.info and head.info.is_master else None
    # promotable: in sync when the master last could acknowledge. A restarted SYNC master answers
    # before its slaves are back and acknowledges nothing then, so its word at that moment does not
    # take promotability away (a crash loop would otherwise block failover for good)
    sync_known = acknowledging(head)
    out = []
    for m in sorted(members.values(), key=lambda m: m.index):
        if m.deleting:
            continue
        entry: dict[str, Any] = {"name": m.name, "role": m.info.role if m.info else m.label_role, "ready": m.ready}
        if m.ip:
            entry["podIP"] = m.ip
        before = last_seen.get(m.name) or {}
        if m.info:
            entry["epoch"] = m.info.epoch
            entry["offset"] = m.info.log_end_offset
            if m.name == master and m.info.is_master and m.info.sync_replicas:
                entry["syncReplicas"] = m.info.sync_replicas  # what failover needs once it is down
            entry["version"] = m.info.version
            if m.info.store_format:
                entry["storeFormat"] = m.info.store_format
        else:
            entry.update({k: before[k] for k in ("epoch", "offset", "version", "storeFormat") if k in before})
        if "syncReplicas" not in entry and m.name == master and "syncReplicas" in before:
            entry["syncReplicas"] = before["syncReplicas"]
        if m.name != master:
            if head_offset is not None and m.info:
                entry["lag"] = max(head_offset - m.info.log_end_offset, 0)
                entry["inSync"] = in_sync(head, m)
                entry["promotable"] = entry["inSync"] if sync_known else promotable(before)
            else:   # the master does not answer: keep what it last said about this slave
                entry.update({k: before[k] for k in ("lag", "inSync", "promotable") if k in before})
            # a log that ends before where it was seen, at the same epoch, lost records it held (a log
            # cut short recovers as a crash's tail; a power cut under ASYNC flush): what it
            # acknowledged may be gone, until it is in sync again (the fault harness, seed 738)
            if lost_records(before, m) or (before.get("lostRecords") and not (sync_known and entry.get("inSync"))):
                entry["lostRecords"], entry["promotable"] = True, False
        out.append(entry)
    gone = last_seen.get(master)
    if gone and not any(e["name"] == master for e in out):
        # the master's pod is being deleted or is gone: its last-seen entry stays, not ready, so
        # failover knows a master that served is lost (a missing entry means one that never served)
        out.append({**{k: v for k, v in gone.items() if k != "podIP"}, "ready": False})
        out.sort(key=lambda e: manifests.pod_index(e["name"]))
    return out


@dataclass
class GroupReport:
    """One broker group as a pass leaves it. `extra` carries what the pass decided or learnt about it
    (masterUnavailableSince, lastFailover, undelivered, drainRouteVersion, ...); None drops a field."""
    index: int
    members: Mapping[str, Member]
    master: str
    epoch: int
    state: str = "active"
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return manifests.group_name(self.index)


@dataclass
class _Health:
    """A group's brokers at a glance, for its block and the TxBroker's phase and conditions."""
    block: dict
    brokers: list[dict]
    phase: str
    ready: int
    replicas: int
    master_ok: bool
    outdated: list[str]
    progressing: bool
    progress_msg: str


def _group_health(spec: Mapping[str, Any], old: Mapping[str, Any], g: GroupReport) -> _Health:
    old_blocks = {b.get("name"): b for b in old.get("groups") or []}
    before = old_blocks.get(g.name) or {}
    had_master = old.get("master") if g.index == 0 else before.get("master")
    replicas = 0 if g.state == "removing" else int(spec.get("replicas", 1))
    old_entries = [b for b in old.get("brokers") or [] if b.get("group", "g0") == g.name]
    brokers = [{**e, "group": g.name} for e in broker_entries(g.members, g.master, old_entries)]
    ready = sum(1 for b in brokers if b["ready"])
    head = g.members.get(g.master)
    master_ok = head is not None and head.alive_master and head.ready
    want_hash = manifests.pod_spec_hash(spec)
    outdated = [m.name for m in g.members.values() if not m.deleting and m.spec_hash != want_hash]
    surplus = [m.name for m in g.members.values() if m.index >= replicas]
    if g.state == "removing":
        phase = "Removing"
    elif master_ok and ready == replicas == len(brokers) and not outdated:
        phase = "Running"
    elif master_ok:
        phase = "Degraded" if ready < len(brokers) else "Updating"
    elif brokers and had_master:
        phase = "Recovering"
    else:
        phase = "Pending"
    progressing = bool(outdated or surplus or len(brokers) != replicas or g.state != "active")
    if outdated:
        progress_msg = f"{len(outdated)} pod(s) to replace with the new spec: {', '.join(sorted(outdated))}"
    elif surplus or len(brokers) != replicas:
        progress_msg = f"{len(brokers)}/{replicas} broker pods"
    else:
        progress_msg = f"{replicas} broker pods on the current spec"
    block = {"name": g.name, "state": g.state, "phase": phase, "master": g.master, "epoch": g.epoch,
             "replicas": replicas, "readyBrokers": ready}
    block.update(g.extra)
    block = {k: v for k, v in block.items() if v is not None}
    return _Health(block, brokers, phase, ready, replicas, master_ok, outdated, progressing, progress_msg)


_SEVERITY = ("Recovering", "Degraded", "Updating", "Removing", "Pending", "Running")


def _phase(healths: list[_Health]) -> str:
    """One group: its phase. Several: Pending while none has a master yet; else the worst of them,
    a group still starting or going away counting as Updating (scaling is under way)."""
    if len(healths) == 1:
        return healths[0].phase
    phases = [h.phase for h in healths]
    if all(p == "Pending" for p in phases):
        return "Pending"
    worst = min(phases, key=_SEVERITY.index)
    return "Updating" if worst in ("Pending", "Removing") else worst


def latest_failover(blocks: list[dict], previous: Mapping[str, Any] | None) -> dict | None:
    """The TxBroker's lastFailover: the latest of its groups' (the failover alert reads it), or the
    one it already records when that is later (a group removed since, or a status from before
    groups, whose lastFailover was g0's)."""
    found = [{**b["lastFailover"], "group": b["name"]} for b in blocks if (b.get("lastFailover") or {}).get("time")]
    if previous and previous.get("time"):
        found.append(dict(previous))
    return max(found, key=lambda x: x["time"]) if found else None


def versions(brokers: list[dict]) -> str:
    """`0.2.0`, or `0.1.0,0.2.0` while brokers of two versions run (a rolling upgrade): the printer
    column Version. Oldest first, as versions compare."""
    def key(v: str):
        return tuple(int(p) if p.isdigit() else 0 for p in v.split("."))
    return ",".join(sorted({b["version"] for b in brokers if b.get("version")}, key=key))


def incompatible(members: Mapping[str, Member]) -> list[str]:
    """Every refusal of replication for the brokers' versions, as the brokers say it (a master names
    the slaves it refused, a slave the master it refused; a broker before 0.2.0 says neither, its
    peer does), each once, naming the broker that said it."""
    seen, out = set(), []
    for m in sorted(members.values(), key=lambda m: m.name):
        why = m.info.incompatible if m.info else ""
        if why and why not in seen:
            seen.add(why)
            out.append(f"{m.name}: {why}")
    return out


def masters(blocks: list[dict]) -> str:
    """`g0=orders-0,g1=orders-g1-1`: the printer column Masters."""
    return ",".join(f"{b['name']}={b.get('master', '')}" for b in blocks if b.get("state") != "removing")


def compute(body: Mapping[str, Any], members: Mapping[str, Member], master: str, epoch: int,
            extra: Mapping[str, Any]) -> dict:
    """Status for a TxBroker of one group (g0). `extra` carries what the pass decided
    (masterUnavailableSince, lastFailover); a None there removes the field (merge patch)."""
    return compute_groups(body, [GroupReport(0, members, master, epoch, "active", extra)], {})


def compute_groups(body: Mapping[str, Any], groups: list[GroupReport], extra: Mapping[str, Any],
                   blocked: list[tuple[str, str, str]] = ()) -> dict:
    """Status for a TxBroker: one block per broker group (status.groups) and, for what read status
    before groups, g0's master, epoch and masterUnavailableSince at the top, every broker in
    `brokers` (each naming its group), the latest failover of any group in lastFailover. `extra`:
    top-level fields the pass decided (routeVersion); `blocked`: (group, reason, message) of
    scale-downs waiting for a group to drain."""
    spec = body.get("spec") or {}
    old = body.get("status") or {}
    groups = sorted(groups, key=lambda g: g.index)
    healths = [_group_health(spec, old, g) for g in groups]
    blocks = [h.block for h in healths]
    single = len(groups) == 1
    head = next((g for g in groups if g.index == 0), groups[0])
    phase = _phase(healths)
    old_conds = old.get("conditions") or []
    brokers = [b for h in healths for b in h.brokers]
    members = {n: m for g in groups for n, m in g.members.items()}
    serving = [h for h in healths if h.block["state"] != "removing"]
    if single:
        h = healths[0]
        ready_msg = f"{h.ready}/{h.replicas} brokers ready; master {h.block['master']}" +             ("" if h.master_ok else " not serving")
        progress_msg = h.progress_msg
        degraded_msg = "" if h.master_ok and h.ready == len(h.brokers) else             f"{len(h.brokers) - h.ready} broker(s) not ready"
    else:
        ready_msg = "; ".join(f"{h.block['name']}: {h.ready}/{h.replicas} brokers ready, master {h.block['master']}"
                              + ("" if h.master_ok else " not serving")
                              + ("" if h.block["state"] == "active" else f" ({h.block['state']})") for h in serving)
        progress_msg = "; ".join(f"{h.block['name']}: " + (h.progress_msg if h.block["state"] == "active"
                                                           else h.block["state"])
                                 for h in healths if h.progressing) or             f"{len(healths)} groups of {healths[0].replicas} broker pods on the current spec"
        degraded_msg = "; ".join(f"{h.block['name']}: " + ("master not serving" if not h.master_ok else
                                                           f"{len(h.brokers) - h.ready} broker(s) not ready")
                                 for h in serving if not h.master_ok or h.ready < len(h.brokers))
    any_down = any(not h.master_ok for h in serving)
    not_ready = any(h.ready < len(h.brokers) for h in healths)
    progressing = any(h.progressing for h in healths)
    rolling = any(h.outdated for h in healths)
    conditions = [
        condition("Ready", phase == "Running", "AllBrokersReady" if phase == "Running" else "BrokersNotReady",
                  ready_msg, old_conds),
        condition("Progressing", progressing, "RollingUpdate" if rolling else ("Scaling" if progressing else "Stable"),
                  progress_msg, old_conds),
        condition("Degraded", any_down or not_ready,
                  "MasterUnavailable" if any_down else ("BrokersNotReady" if not_ready else "AsExpected"),
                  degraded_msg, old_conds),
    ]
    unreadable = sorted(m.name for m in members.values() if m.incompatible)
    conditions.append(condition(
        "BrokersCompatible", not unreadable, "IncompatibleAnswer" if unreadable else "AsExpected",
        f"the operator cannot read what {', '.join(unreadable)} answer(s) (a broker of another version?); "
        "they count as alive, and no failover is decided from them" if unreadable else "", old_conds))
    refused = incompatible(members)
    conditions.append(condition(
        "ReplicationCompatible", not refused, "IncompatibleVersions" if refused else "AsExpected",
        "replication stopped, the brokers' versions do not work together (docs/upgrading.md): " + "; ".join(refused)
        if refused else "", old_conds))
    last = latest_failover(blocks, old.get("lastFailover"))
    if last:
        # stays True after a failover; its time is the latest failover's, so a second one shows
        conditions.append(condition("FailedOver", True, "MasterLost", last.get("message", ""), old_conds,
                                    since=last.get("time")))
    restored = restore.condition(extra["restore"] if "restore" in extra else old.get("restore"))
    if restored is not None:
        conditions.append(condition("Restored", *restored, old_conds))
    if blocked:
        conditions.append(condition("ScaleDownBlocked", True, blocked[0][1], "; ".join(m for _, _, m in blocked),
                                    old_conds))
    elif any(h.block["state"] != "active" for h in healths) or any(x.get("type") == "ScaleDownBlocked"
                                                                   for x in old_conds):
        conditions.append(condition("ScaleDownBlocked", False, "NotBlocked", "", old_conds))
    new = {
        "phase": phase,
        "master": head.master,
        "epoch": head.epoch,
        "brokers": brokers,
        "conditions": conditions,
        "observedGeneration": (body.get("metadata") or {}).get("generation"),
        "groups": blocks,
        "masters": masters(blocks),
        "version": versions(brokers),
        "operatorVersion": __version__,
    }
    if head.index == 0:
        new["masterUnavailableSince"] = head.extra.get("masterUnavailableSince")
    new["lastFailover"] = last
    new.update(extra)
    if "masterUnavailableSince" not in head.extra:
        new.pop("masterUnavailableSince", None)
    return new
