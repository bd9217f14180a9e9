"""The operator's recent Kubernetes Events: read from the API server with the pod's service-account
token, only when the console runs in a cluster (no client package needed: one GET)."""

from __future__ import annotations

import json
import os
import ssl
import urllib.request
from dataclasses import dataclass

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
OPERATOR_COMPONENT = "txbroker-operator"


@dataclass
class Event:
    time: str
    type: str
    reason: str
    object: str
    message: str
    count: int = 1


def operator_events(doc: dict, limit: int = 50) -> list[Event]:
    """The operator's Events of a v1 EventList, newest first."""
    out = []
    for e in doc.get("items") or []:
        component = e.get("reportingComponent") or (e.get("source") or {}).get("component") or ""
        if component != OPERATOR_COMPONENT:
            continue
        obj = e.get("involvedObject") or {}
        when = e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or ""
        out.append(Event(when, e.get("type", ""), e.get("reason", ""), f"{obj.get('kind', '')}/{obj.get('name', '')}",
                         e.get("message", ""), int(e.get("count") or 1)))
    out.sort(key=lambda ev: ev.time, reverse=True)
    return out[:limit]


class OperatorEvents:
    """`available` is False outside a cluster (`why` says so for the page)."""

    def __init__(self, namespace: str | None = None, account_dir: str = SERVICE_ACCOUNT):
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        self.why = ""
        self.base = ""
        if not host or not os.path.exists(os.path.join(account_dir, "token")):
            self.why = "not in a cluster"
            return
        self.account_dir = account_dir
        if namespace is None:
            with open(os.path.join(account_dir, "namespace")) as f:
                namespace = f.read().strip()
        self.namespace = namespace
        self.base = f"https://{host if ':' not in host else f'[{host}]'}:{port}"

    @property
    def available(self) -> bool:
        return bool(self.base)

    def recent(self, limit: int = 50) -> list[Event]:
        with open(os.path.join(self.account_dir, "token")) as f:
            token = f.read().strip()  # read each time: kubelet rotates it
        ctx = ssl.create_default_context(cafile=os.path.join(self.account_dir, "ca.crt"))
        req = urllib.request.Request(f"{self.base}/api/v1/namespaces/{self.namespace}/events?limit=500",
                                     headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return operator_events(json.load(r), limit)
