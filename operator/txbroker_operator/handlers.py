"""Kopf registrations. Load with `kopf run -m txbroker_operator.handlers`.

No timers or daemons on TxBrokers on purpose: Kopf puts a finalizer on objects that have them, and
a TxBroker would then hang in deletion whenever the operator is not running (e.g. `helm uninstall`
removing both at once). Reconciliation is event-driven: the TxBroker's own create/update/resume,
and every event of one of its pods.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from . import constants as c
from . import kube
from .reconcile import sync


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Keep Kopf's bookkeeping in our own annotations, none in .status (the CRD schema owns .status).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{c.GROUP}/finalizer"
    settings.posting.level = logging.WARNING     # Kubernetes Events for warnings and errors only
    settings.watching.server_timeout = 300
    kube.rest()    # fail fast on missing credentials


@kopf.on.resume(c.GROUP, c.VERSION, c.TXBROKER_PLURAL)
@kopf.on.create(c.GROUP, c.VERSION, c.TXBROKER_PLURAL)
@kopf.on.update(c.GROUP, c.VERSION, c.TXBROKER_PLURAL, field="spec")
def txbroker_changed(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    sync(body, logger)


@kopf.on.event("v1", "pods", labels={c.LABEL_MANAGED_BY: c.MANAGED_BY})
def broker_pod_event(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    """A broker pod changed (created, got an IP, became ready, died): re-run its TxBroker's pass."""
    broker = body.metadata.labels.get(c.LABEL_BROKER)
    if not broker:
        return
    txb = kube.get_txbroker(body.metadata.namespace, broker)
    if txb is None or txb["metadata"].get("deletionTimestamp"):
        return
    sync(txb, logger)
