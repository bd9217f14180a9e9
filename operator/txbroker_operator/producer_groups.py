"""TxProducerGroup: apply a group's check-back settings to its TxBroker's masters (one per broker
group), live.

The settings are log records on the brokers: the master writes them and its slaves replicate them,
so a promoted slave already runs them and a broker restart keeps them. Level-based like the
TxBroker pass: each pass reads what every broker runs (the generation stored with the group's
settings, GET /api/v1/groups), applies the resource's metadata.generation to the master where they
differ, and reports the group applied once every broker runs it (a slave by replication). A master
with fresh storage, or one that took over before a slave had the record, gets them again on the
next pass; operator and brokers write the same whole settings, so they agree.

Deleting a TxProducerGroup needs no finalizer: the TxBroker pass removes, through the master,
group settings the operator once applied (generation > 0) that no TxProducerGroup names any more.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from txbroker.protocol import admin as answers

from . import brokers, events, kube, manifests, observe, security, status
from . import constants as c

Logger = logging.Logger | logging.LoggerAdapter


def group_name(body: Mapping[str, Any]) -> str:
    return (body.get("spec") or {}).get("groupName") or body["metadata"]["name"]


def broker_settings(spec: Mapping[str, Any]) -> dict:
    """spec -> the broker's per-group transaction settings. checkMode ledger is require_job: every
    transaction of the group must join a coordinated transaction (a job, broker/transaction/jobs.py), which the
    broker ends from the job's decision, so nobody answers check-backs for it; the broker refuses the
    group's half messages that join no job."""
    mode = spec.get("checkMode", "connection")
    out = {"check_interval_ms": int(spec.get("checkIntervalSeconds", 60)) * 1000,
           "timeout_ms": int(spec.get("timeoutSeconds", 6)) * 1000,
           "check_max": int(spec.get("checkMax", 15)),
           "default_immunity_ms": int(spec.get("immunitySeconds", 0)) * 1000,
           "webhook_url": spec.get("webhookUrl", "") if mode == "http" else "",
           "require_job": mode == "ledger"}
    return out


def runs_settings(current: answers.GroupSettings | None, want: Mapping[str, Any], generation: int) -> bool:
    """Whether a broker's answer for a group (`current`) shows `want` applied at `generation`."""
    return current is not None and current.generation == generation and \
        all(getattr(current, k, None) == v for k, v in want.items())


def applied_generation(applied: list[dict]) -> int | None:
    """The generation every broker listed runs at least (the oldest one still running); None (field
    removed) while no broker has the settings."""
    gens = [a["generation"] for a in applied if isinstance(a.get("generation"), int)]
    return min(gens) if gens else None


def group_masters(txb_status: Mapping[str, Any]) -> dict[int, str]:
    """Broker group index -> the pod its TxBroker's status names master (g0's is also the top-level
    master). Settings go to every group's master; each group's slaves replicate them from it."""
    out = {manifests.group_index(b.get("name", "")): b["master"] for b in txb_status.get("groups") or []
           if b.get("master") and b.get("state") != "removing"}
    if txb_status.get("master"):
        out[0] = txb_status["master"]
    return out


def sync_group(body: Mapping[str, Any], logger: Logger) -> dict:
    meta, spec = body["metadata"], body.get("spec") or {}
    ns, generation = meta["namespace"], int(meta.get("generation") or 1)
    group = group_name(body)
    broker_name = spec["brokerRef"]["name"]
    old = body.get("status") or {}
    old_conds = old.get("conditions") or []
    txb = kube.get_txbroker(ns, broker_name)
    if txb is None:
        msg = f"TxBroker {broker_name} not found in namespace {ns}"
        events.post_once(body, events.WARNING, "BrokerNotFound", msg)
        new = {"observedGeneration": generation, "applied": [], "appliedGeneration": None,
               "conditions": [status.condition("Ready", False, "BrokerNotFound", msg, old_conds),
                              status.condition("Applied", False, "BrokerNotFound", msg, old_conds)]}
        _save(body, old, new)
        return new

    want = broker_settings(spec)
    try:
        access = security.access_for(txb)
    except security.SecretProblem:
        return {}   # the TxBroker's pass reports it
    pods = kube.list_pods(ns, manifests.selector_labels(broker_name))
    members = observe.observe(pods, access, ask_brokers=False)
    masters = group_masters(txb.get("status") or {})
    applied, missing = [], []
    for m in sorted(members.values(), key=lambda m: (m.group, m.index)):
        if m.deleting or not m.ip:
            continue
        try:
            current = access.groups(m.ip).get(group)
            if not runs_settings(current, want, generation):
                if m.name not in masters.values():  # a slave gets them from its master's log
                    missing.append(f"{m.name} (replicating)" if masters.get(m.group) else m.name)
                    continue
                access.put_group(m.ip, group, want, generation)
                logger.info("group %s: generation %d applied through master %s", group, generation, m.name)
                if current:
                    events.post(body, events.NORMAL, "Applied",
                                f"generation {generation} applied through master {m.name} (check interval "
                                f"{want['check_interval_ms'] // 1000}s)")
            applied.append({"name": m.name, "generation": generation})
        except (brokers.Unreachable, brokers.BrokerError) as e:
            missing.append(m.name)
            logger.info("group %s: broker %s not reachable yet: %s", group, m.name, e)
            prev = next((a for a in old.get("applied") or [] if a.get("name") == m.name), None)
            if prev:
                applied.append(prev)

    new: dict[str, Any] = {"observedGeneration": generation, "applied": applied,
                           "appliedGeneration": applied_generation(applied)}
    heads = [members[n] for n in masters.values() if n in members and members[n].ip]
    if heads:
        try:   # every broker group's master holds its own transactions: the group's count is their sum
            new["pending"] = sum(access.transaction_count(h.ip, group, "pending") for h in heads)
            new["parked"] = sum(access.transaction_count(h.ip, group, "parked") for h in heads)
        except (brokers.Unreachable, brokers.BrokerError):
            pass
    all_applied = not missing and bool(applied) and all(a["generation"] == generation for a in applied)
    applied_msg = (f"generation {generation} runs on {len(applied)} broker(s)" if all_applied
                   else f"waiting for: {', '.join(missing) or 'broker pods'}")
    new["conditions"] = [
        status.condition("Ready", all_applied, "Applied" if all_applied else "Pending", applied_msg, old_conds),
        status.condition("Applied", all_applied, "Applied" if all_applied else "Pending", applied_msg, old_conds),
    ]
    creds = (spec.get("credentialsSecretRef") or {}).get("name")
    if creds:
        try:
            security.group_credentials(ns, creds)
            new["conditions"].append(status.condition("CredentialsFound", True, "Found",
                                                      f"Secret {creds} holds access-key and secret-key", old_conds))
        except security.SecretProblem as e:
            events.post_once(body, events.WARNING, "SecretInvalid", str(e))
            new["conditions"].append(status.condition("CredentialsFound", False, "SecretInvalid", str(e), old_conds))
    if new.get("parked"):
        new["conditions"].append(status.condition(
            "Parked", True, "CheckMaxReached",
            f"{new['parked']} transaction(s) parked after checkMax checks; `txbroker tx list` shows them, "
            "`txbroker tx resume` brings one back", old_conds))
    _save(body, old, new)
    return new


def _save(body: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    changed = {k: v for k, v in new.items() if old.get(k) != v}
    if changed:
        kube.patch_status(c.TXPRODUCERGROUP_KIND, body["metadata"]["namespace"], body["metadata"]["name"], changed)


def remove_orphans(namespace: str, broker_name: str, members: Mapping[str, observe.Member], access: brokers.Access,
                   logger: Logger) -> None:
    """Drop operator-applied group settings that no TxProducerGroup for this TxBroker names any more."""
    wanted = {group_name(g) for g in kube.list_objects(c.TXPRODUCERGROUP_KIND, namespace)
              if (g.get("spec") or {}).get("brokerRef", {}).get("name") == broker_name
              and not g["metadata"].get("deletionTimestamp")}
    for m in members.values():  # the master removes them; its slaves replicate the removal
        if m.info is None or not m.ip or m.info.role != "master" or m.info.fenced_by:
            continue
        try:
            for group, doc in access.groups(m.ip).items():
                if doc.generation > 0 and group not in wanted:
                    access.delete_group(m.ip, group)
                    logger.info("group %s: settings removed through master %s (no TxProducerGroup names it)",
                                group, m.name)
        except (brokers.Unreachable, brokers.BrokerError) as e:
            logger.info("could not list groups on %s: %s", m.name, e)
