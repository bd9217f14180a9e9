"""Pure: what the pods look like -> the TxBroker's status."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping

from . import constants as c


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(x.get("type") == "Ready" and x.get("status") == "True" for x in conds)


def condition(type_: str, ok: bool, reason: str, message: str, old: list[dict]) -> dict:
    status = "True" if ok else "False"
    prev = next((x for x in old if x.get("type") == type_), None)
    since = prev["lastTransitionTime"] if prev and prev.get("status") == status and prev.get("lastTransitionTime") else now()
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}


def compute(body: Mapping[str, Any], pods: list[dict], master: str | None) -> dict:
    """Status for a TxBroker given its pods (the brokers' offsets and lag come with a later issue)."""
    spec = body.get("spec") or {}
    old = body.get("status") or {}
    replicas = int(spec.get("replicas", 1))
    by_name = {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}
    brokers = []
    for name in sorted(by_name, key=lambda n: int(by_name[n]["metadata"]["labels"].get(c.LABEL_INDEX, 0))):
        p = by_name[name]
        entry: dict[str, Any] = {"name": name, "role": p["metadata"]["labels"].get(c.LABEL_ROLE, c.ROLE_SLAVE),
                                 "ready": pod_ready(p)}
        if (p.get("status") or {}).get("podIP"):
            entry["podIP"] = p["status"]["podIP"]
        brokers.append(entry)
    ready = sum(1 for b in brokers if b["ready"])
    master_ready = any(b["name"] == master and b["ready"] for b in brokers)
    if ready == replicas and len(brokers) == replicas:
        phase = "Running"
    elif master_ready:
        phase = "Degraded"
    else:
        phase = "Pending"
    old_conds = old.get("conditions") or []
    conditions = [
        condition("Ready", phase == "Running", "AllBrokersReady" if phase == "Running" else "BrokersNotReady",
                  f"{ready}/{replicas} brokers ready", old_conds),
        condition("Progressing", phase != "Running", "Reconciling" if phase != "Running" else "Stable",
                  f"{len(brokers)}/{replicas} broker pods exist", old_conds),
        condition("Degraded", phase == "Degraded", "SlavesNotReady" if phase == "Degraded" else "AsExpected",
                  "the master is ready but some slave is not" if phase == "Degraded" else "", old_conds),
    ]
    return {
        "phase": phase,
        "master": master,
        "epoch": int(old.get("epoch") or 1),
        "brokers": brokers,
        "conditions": conditions,
        "observedGeneration": (body.get("metadata") or {}).get("generation"),
    }
