"""One level-triggered pass over a TxBroker: create what is missing, then report status.

Idempotent and safe to run concurrently for the same TxBroker (creation is create-if-absent), so it
is called from the TxBroker's create/update/resume handlers and on every event of one of its pods.

Today: services, one PVC per pod when spec.storage is set, pod `<name>-0` as master, pods
`<name>-1..` as slaves of the master's pod IP once it has one (replication, flush and transaction
settings passed as `txbroker broker` flags), scale-down of surplus pods, status.
Later issues add: failover (promote a slave at epoch+1, relabel), rolling updates (a changed spec
reaches new pods only; running pods keep their arguments), TxProducerGroup, brokers' offsets/lag.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import kopf

from . import constants as c
from . import kube, manifests, status


def reconcile(body: Mapping[str, Any], logger: logging.Logger | logging.LoggerAdapter) -> dict:
    """Bring the children of `body` (a TxBroker) in line with its spec; return its new status."""
    meta, spec = body["metadata"], body.get("spec") or {}
    name, ns = meta["name"], meta["namespace"]
    replicas = int(spec.get("replicas", 1))

    children = [manifests.headless_service(name, ns), manifests.master_service(name, ns)]
    if spec.get("storage"):
        children += [manifests.data_pvc(name, ns, spec, i) for i in range(replicas)]
    for obj in children:
        if obj["kind"] == "Service":   # PVCs are not owned: like a StatefulSet's, they outlive the broker
            kopf.adopt(obj, owner=body)
        if kube.create_if_absent(obj):
            logger.info("created %s %s", obj["kind"], obj["metadata"]["name"])

    pods = {p["metadata"]["name"]: p for p in kube.list_pods(ns, manifests.selector_labels(name))}
    master = (body.get("status") or {}).get("master") or manifests.pod_name(name, 0)

    def create_pod(index: int, master_address: str | None) -> None:
        pod = manifests.broker_pod(name, ns, spec, index, master_address)
        kopf.adopt(pod, owner=body)
        if kube.create_if_absent(pod):
            logger.info("created pod %s (%s)", pod["metadata"]["name"], pod["metadata"]["labels"][c.LABEL_ROLE])

    if master not in pods:
        create_pod(0, None)
    else:
        master_ip = (pods[master].get("status") or {}).get("podIP")
        if master_ip:   # slaves start once the master has an address to replicate from
            for i in range(1, replicas):
                if manifests.pod_name(name, i) not in pods:
                    create_pod(i, manifests.broker_address(master_ip))

    for pod_name, pod in pods.items():   # scale down: highest ordinals go
        index = int(pod["metadata"]["labels"].get(c.LABEL_INDEX, 0))
        if index >= replicas and pod_name != master and not pod["metadata"].get("deletionTimestamp"):
            logger.info("deleting surplus pod %s", pod_name)
            kube.delete_pod(ns, pod_name)

    pods = kube.list_pods(ns, manifests.selector_labels(name))
    return status.compute(body, pods, master)


def sync(body: Mapping[str, Any], logger: logging.Logger | logging.LoggerAdapter) -> dict:
    """reconcile() and write the status (only when it changed)."""
    new = reconcile(body, logger)
    old = dict(body.get("status") or {})
    if any(old.get(k) != v for k, v in new.items()):
        kube.patch_txbroker_status(body["metadata"]["namespace"], body["metadata"]["name"], new)
    return new
