"""Kubernetes Events on our resources: what an operator on call reads first (`kubectl describe txb`).

Posted straight through the API (not Kopf's posting queue), so the periodic health pass, which runs
outside any Kopf handler, can post them too. A failed post is logged, never raised: an Event is
worth less than the reconciliation that produced it.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any, Mapping

from . import kube
from .status import now

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"
_COMPONENT = "txbroker-operator"


def post(obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    meta = obj["metadata"]
    ts = now()
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta.get("uid")},
        "type": type_, "reason": reason, "message": message[:1024],
        "source": {"component": _COMPONENT, "host": os.environ.get("HOSTNAME", "")},
        "reportingComponent": _COMPONENT, "reportingInstance": os.environ.get("HOSTNAME", _COMPONENT),
        "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
    }
    (log.warning if type_ == WARNING else log.info)("%s %s/%s: %s: %s", obj.get("kind"), meta["namespace"],
                                                    meta["name"], reason, message)
    try:
        kube.create_if_absent(event)
    except Exception as e:  # noqa: BLE001 - see module docstring
        log.error("could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], e)


_last_posted: dict[tuple[str, str, str], str] = {}


def post_once(obj: Mapping[str, Any], type_: str, reason: str, message: str, subject: str = "") -> None:
    """Post unless this object's last event of this reason (about this `subject`: a broker group,
    say) said the same (the periodic pass would otherwise repeat a standing problem every few seconds)."""
    key = (obj["metadata"].get("uid", ""), reason, subject)
    if _last_posted.get(key) == message:
        return
    _last_posted[key] = message
    post(obj, type_, reason, message)


_last_at: dict[tuple[str, str, str], float] = {}


def post_every(obj: Mapping[str, Any], type_: str, reason: str, message: str, subject: str = "",
               interval: float = 300.0) -> None:
    """Post at most once per `interval` seconds for this object, reason and `subject`: a standing
    problem whose message changes every pass (a count going down) is said again now and then, not
    every few seconds. A new subject (another cause) is said at once."""
    key = (obj["metadata"].get("uid", ""), reason, subject)
    at = time.monotonic()
    if key in _last_at and at - _last_at[key] < interval:
        return
    _last_at[key] = at
    post(obj, type_, reason, message)
