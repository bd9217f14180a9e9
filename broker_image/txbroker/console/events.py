"""The operator's recent Kubernetes Events (in a cluster only; the kubernetes package is optional)."""

from __future__ import annotations

import os
from dataclasses import dataclass

_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
OPERATOR_COMPONENT = "txbroker-operator"


@dataclass
class Event:
    time: str
    type: str
    reason: str
    object: str
    message: str


class OperatorEvents:
    """Reads Events of the console's namespace that the operator posted. `available` is False (and
    `why` says so) outside a cluster or without the kubernetes package."""

    def __init__(self, namespace: str | None = None):
        self.api = None
        self.namespace = namespace
        self.why = ""
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            self.why = "not in a cluster"
            return
        try:
            from kubernetes import client, config
        except ImportError:
            self.why = "not available: the kubernetes package is not installed"
            return
        try:
            config.load_incluster_config()
        except Exception as e:  # noqa: BLE001 - shown on the page
            self.why = f"not available: {e}"
            return
        if self.namespace is None:
            try:
                with open(_NAMESPACE_FILE) as f:
                    self.namespace = f.read().strip()
            except OSError:
                self.namespace = "default"
        self.api = client.CoreV1Api()

    @property
    def available(self) -> bool:
        return self.api is not None

    def recent(self, limit: int = 50) -> list[Event]:
        items = self.api.list_namespaced_event(self.namespace, _request_timeout=10).items
        out = []
        for e in items:
            component = e.reporting_component or (e.source.component if e.source else "") or ""
            if component != OPERATOR_COMPONENT:
                continue
            when = e.last_timestamp or e.event_time or e.first_timestamp
            obj = e.involved_object
            out.append(Event(when.isoformat() if when else "", e.type or "", e.reason or "",
                             f"{obj.kind}/{obj.name}" if obj else "", e.message or ""))
        out.sort(key=lambda ev: ev.time, reverse=True)
        return out[:limit]
