"""Pure: what the pods and brokers look like -> the TxBroker's status."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping

from . import manifests
from .observe import Member, acknowledging, in_sync


def now(at: float | None = None) -> str:
    """The time (`at`, seconds since the epoch, or now) as status and conditions write it."""
    t = datetime.now(timezone.utc) if at is None else datetime.fromtimestamp(at, timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


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
        else:
            entry.update({k: before[k] for k in ("epoch", "offset") if k in before})
        if m.name != master:
            if head_offset is not None and m.info:
                entry["lag"] = max(head_offset - m.info.log_end_offset, 0)
                entry["inSync"] = in_sync(head, m)
                entry["promotable"] = entry["inSync"] if sync_known else promotable(before)
            else:   # the master does not answer: keep what it last said about this slave
                entry.update({k: before[k] for k in ("lag", "inSync", "promotable") if k in before})
        out.append(entry)
    gone = last_seen.get(master)
    if gone and not any(e["name"] == master for e in out):
        # the master's pod is being deleted or is gone: its last-seen entry stays, not ready, so
        # failover knows a master that served is lost (a missing entry means one that never served)
        out.append({**{k: v for k, v in gone.items() if k != "podIP"}, "ready": False})
        out.sort(key=lambda e: manifests.pod_index(e["name"]))
    return out


def compute(body: Mapping[str, Any], members: Mapping[str, Member], master: str, epoch: int,
            extra: Mapping[str, Any]) -> dict:
    """Status for a TxBroker. `extra` carries what the pass decided (masterUnavailableSince,
    lastFailover); a None there removes the field (merge patch)."""
    spec = body.get("spec") or {}
    old = body.get("status") or {}
    replicas = int(spec.get("replicas", 1))
    brokers = broker_entries(members, master, old.get("brokers") or [])
    ready = sum(1 for b in brokers if b["ready"])
    head = members.get(master)
    master_ok = head is not None and head.alive_master and head.ready
    want_hash = manifests.pod_spec_hash(spec)
    outdated = [m.name for m in members.values() if not m.deleting and m.spec_hash != want_hash]
    surplus = [m.name for m in members.values() if m.index >= replicas]
    if master_ok and ready == replicas == len(brokers) and not outdated:
        phase = "Running"
    elif master_ok:
        phase = "Degraded" if ready < len(brokers) else "Updating"
    elif brokers and old.get("master"):
        phase = "Recovering"
    else:
        phase = "Pending"
    old_conds = old.get("conditions") or []
    progressing = bool(outdated or surplus or len(brokers) != replicas)
    if outdated:
        progress_msg = f"{len(outdated)} pod(s) to replace with the new spec: {', '.join(sorted(outdated))}"
    elif surplus or len(brokers) != replicas:
        progress_msg = f"{len(brokers)}/{replicas} broker pods"
    else:
        progress_msg = f"{replicas} broker pods on the current spec"
    last = extra.get("lastFailover") or old.get("lastFailover")
    conditions = [
        condition("Ready", phase == "Running", "AllBrokersReady" if phase == "Running" else "BrokersNotReady",
                  f"{ready}/{replicas} brokers ready; master {master}" + ("" if master_ok else " not serving"),
                  old_conds),
        condition("Progressing", progressing, "RollingUpdate" if outdated else ("Scaling" if progressing else "Stable"),
                  progress_msg, old_conds),
        condition("Degraded", not master_ok or ready < len(brokers),
                  "MasterUnavailable" if not master_ok else ("BrokersNotReady" if ready < len(brokers) else "AsExpected"),
                  "" if master_ok and ready == len(brokers) else f"{len(brokers) - ready} broker(s) not ready", old_conds),
    ]
    unreadable = sorted(m.name for m in members.values() if m.incompatible)
    conditions.append(condition(
        "BrokersCompatible", not unreadable, "IncompatibleAnswer" if unreadable else "AsExpected",
        f"the operator cannot read what {', '.join(unreadable)} answer(s) (a broker of another version?); "
        "they count as alive, and no failover is decided from them" if unreadable else "", old_conds))
    if last:
        # stays True after a failover; its time is the latest failover's, so a second one shows
        conditions.append(condition("FailedOver", True, "MasterLost", last.get("message", ""), old_conds,
                                    since=last.get("time")))
    new = {
        "phase": phase,
        "master": master,
        "epoch": epoch,
        "brokers": brokers,
        "conditions": conditions,
        "observedGeneration": (body.get("metadata") or {}).get("generation"),
    }
    new.update(extra)
    return new
