"""Kopf registrations. Load with `kopf run -m txbroker_operator.handlers` (or `python -m txbroker_operator`).

No timers, daemons or deletion handlers: those put finalizers on objects, and a TxBroker would then
hang in deletion whenever the operator is not running. Owner references clean up what a TxBroker
owns. Reconciliation runs on the resources' own changes, on every event of a broker pod, and on the
periodic pass (health.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from . import constants as c
from . import health, kube, metrics, producer_groups
from .reconcile import sync


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Keep Kopf's bookkeeping in our own annotations, none in .status (the CRD schema owns .status).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{c.GROUP}/finalizer"
    settings.posting.level = logging.WARNING     # Kopf's own Events: warnings and errors only
    settings.watching.server_timeout = 300
    kube.rest()    # fail fast on missing credentials
    if not getattr(memo, "metrics_port", None):   # once per process (Kopf may restart its handlers)
        memo.metrics_port = metrics.serve()
    memo.health = asyncio.get_running_loop().create_task(health.run(), name="periodic-pass")


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "health", None)
    if task is not None:
        task.cancel()


@kopf.on.event(c.GROUP, c.VERSION, c.TXBROKER_PLURAL)
def txbroker_seen(type: str | None, body: kopf.Body, **_: Any) -> None:
    health.remember(health.seen_brokers, type, body.metadata.namespace, body.metadata.name)


@kopf.on.event(c.GROUP, c.VERSION, c.TXPRODUCERGROUP_PLURAL)
def txproducergroup_seen(type: str | None, body: kopf.Body, **_: Any) -> None:
    health.remember(health.seen_groups, type, body.metadata.namespace, body.metadata.name)


@kopf.on.resume(c.GROUP, c.VERSION, c.TXBROKER_PLURAL)
@kopf.on.create(c.GROUP, c.VERSION, c.TXBROKER_PLURAL)
@kopf.on.update(c.GROUP, c.VERSION, c.TXBROKER_PLURAL, field="spec")
def txbroker_changed(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    sync(body, logger)


@kopf.on.resume(c.GROUP, c.VERSION, c.TXPRODUCERGROUP_PLURAL)
@kopf.on.create(c.GROUP, c.VERSION, c.TXPRODUCERGROUP_PLURAL)
@kopf.on.update(c.GROUP, c.VERSION, c.TXPRODUCERGROUP_PLURAL, field="spec")
def txproducergroup_changed(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    producer_groups.sync_group(body, logger)


@kopf.on.event("v1", "pods", labels={c.LABEL_MANAGED_BY: c.MANAGED_BY})
def broker_pod_event(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    """A broker pod changed (created, got an IP, became ready, died, was relabelled): re-run its
    TxBroker's pass."""
    broker = body.metadata.labels.get(c.LABEL_BROKER)
    if not broker:
        return
    txb = kube.get_txbroker(body.metadata.namespace, broker)
    if txb is None or txb["metadata"].get("deletionTimestamp"):
        return
    sync(txb, logger)
