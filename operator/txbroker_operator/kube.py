"""The Kubernetes API calls the operator makes, as plain JSON over HTTPS.

Kopf watches and dispatches; changes to other objects go through here. Credentials come from the
`kubernetes` package's config loaders (in-cluster ServiceAccount, else KUBECONFIG), requests are
plain REST on dicts (no generated model classes, whose API changes between client majors). Every
RBAC rule in helm/txbroker/templates/_helpers.tpl corresponds to a call below or to Kopf's watching.
"""

from __future__ import annotations

import json
import ssl
import threading
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client, config

from . import constants as c


class ApiError(Exception):
    def __init__(self, status: int, body: Any, what: str):
        self.status, self.body = status, body
        msg = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{what}: HTTP {status}: {msg}")


class Rest:
    """Minimal JSON REST client on a `kubernetes.client.Configuration`."""

    def __init__(self, cfg: client.Configuration):
        self.cfg = cfg
        if cfg.verify_ssl:
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        else:
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        self.pool = urllib3.PoolManager(num_pools=2, maxsize=8, ssl_context=ctx)

    def request(self, method: str, path: str, body: Any = None, *, query: dict | None = None,
                content_type: str = "application/json", timeout: float = 30) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        auth = self.cfg.auth_settings().get("BearerToken")   # refreshes rotating tokens
        if auth and auth.get("value"):
            headers["Authorization"] = auth["value"]
        url = self.cfg.host.rstrip("/") + path + ("?" + urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        r = self.pool.request(method, url, body=data, headers=headers, timeout=timeout, retries=False)
        try:
            decoded = json.loads(r.data) if r.data else None
        except ValueError:
            decoded = r.data.decode(errors="replace")
        if not 200 <= r.status < 300:
            raise ApiError(r.status, decoded, f"{method} {path}")
        return decoded


_lock = threading.Lock()
_rest: Rest | None = None


def rest() -> Rest:
    global _rest
    with _lock:
        if _rest is None:
            cfg = client.Configuration()
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)
            _rest = Rest(cfg)
        return _rest


# kind -> (API group/version prefix, plural)
_KINDS = {
    "Pod": ("/api/v1", "pods"),
    "Service": ("/api/v1", "services"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Event": ("/api/v1", "events"),
    "Secret": ("/api/v1", "secrets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    c.TXBROKER_KIND: (f"/apis/{c.GROUP}/{c.VERSION}", c.TXBROKER_PLURAL),
    c.TXPRODUCERGROUP_KIND: (f"/apis/{c.GROUP}/{c.VERSION}", c.TXPRODUCERGROUP_PLURAL),
}


def _path(kind: str, namespace: str, name: str | None = None) -> str:
    base, plural = _KINDS[kind]
    return f"{base}/namespaces/{quote(namespace)}/{plural}" + (f"/{quote(name)}" if name else "")


def create_if_absent(obj: dict) -> bool:
    """Create `obj`; True if created, False if an object of that name already exists."""
    try:
        rest().request("POST", _path(obj["kind"], obj["metadata"]["namespace"]), obj)
        return True
    except ApiError as e:
        if e.status == 409:
            return False
        raise


def get(kind: str, namespace: str, name: str) -> dict | None:
    try:
        return rest().request("GET", _path(kind, namespace, name))
    except ApiError as e:
        if e.status == 404:
            return None
        raise


def merge_patch(kind: str, namespace: str, name: str, patch: dict, subresource: str = "") -> dict | None:
    """JSON merge patch (lists in it are replaced whole); None if the object is gone."""
    try:
        return rest().request("PATCH", _path(kind, namespace, name) + (f"/{subresource}" if subresource else ""),
                              patch, content_type="application/merge-patch+json")
    except ApiError as e:
        if e.status == 404:
            return None
        raise


def list_objects(kind: str, namespace: str, labels: dict[str, str] | None = None) -> list[dict]:
    query = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else None
    return rest().request("GET", _path(kind, namespace), query=query)["items"]


def delete(kind: str, namespace: str, name: str) -> bool:
    """Delete; False if it was not there."""
    try:
        rest().request("DELETE", _path(kind, namespace, name))
        return True
    except ApiError as e:
        if e.status == 404:
            return False
        raise


def list_pods(namespace: str, labels: dict[str, str]) -> list[dict]:
    return list_objects("Pod", namespace, labels)


def delete_pod(namespace: str, name: str) -> None:
    delete("Pod", namespace, name)


def own_namespace() -> str:
    """The namespace the operator runs in (its NetworkPolicies let that namespace reach the admin API)."""
    import os
    env = os.environ.get("TXBROKER_OPERATOR_NAMESPACE")
    if env:
        return env
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip()
    except OSError:
        return "default"


def get_txbroker(namespace: str, name: str) -> dict | None:
    return get(c.TXBROKER_KIND, namespace, name)


def patch_status(kind: str, namespace: str, name: str, status: dict) -> None:
    """Merge-patch .status through the status subresource; a deleted object is no error."""
    merge_patch(kind, namespace, name, {"status": status}, subresource="status")


def patch_txbroker_status(namespace: str, name: str, status: dict) -> None:
    patch_status(c.TXBROKER_KIND, namespace, name, status)
