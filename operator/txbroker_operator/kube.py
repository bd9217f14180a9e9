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


_PATHS = {"Pod": "pods", "Service": "services", "PersistentVolumeClaim": "persistentvolumeclaims"}


def _ns_path(namespace: str, plural: str, name: str | None = None, group: str = "") -> str:
    base = f"/apis/{group}/{c.VERSION}" if group else "/api/v1"
    return f"{base}/namespaces/{quote(namespace)}/{plural}" + (f"/{quote(name)}" if name else "")


def create_if_absent(obj: dict) -> bool:
    """Create `obj`; True if created, False if an object of that name already exists."""
    try:
        rest().request("POST", _ns_path(obj["metadata"]["namespace"], _PATHS[obj["kind"]]), obj)
        return True
    except ApiError as e:
        if e.status == 409:
            return False
        raise


def list_pods(namespace: str, labels: dict[str, str]) -> list[dict]:
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    return rest().request("GET", _ns_path(namespace, "pods"), query={"labelSelector": selector})["items"]


def delete_pod(namespace: str, name: str) -> None:
    try:
        rest().request("DELETE", _ns_path(namespace, "pods", name))
    except ApiError as e:
        if e.status != 404:
            raise


def get_txbroker(namespace: str, name: str) -> dict | None:
    try:
        return rest().request("GET", _ns_path(namespace, c.TXBROKER_PLURAL, name, group=c.GROUP))
    except ApiError as e:
        if e.status == 404:
            return None
        raise


def patch_txbroker_status(namespace: str, name: str, status: dict) -> None:
    """Merge-patch .status through the status subresource (lists in it are replaced whole)."""
    try:
        rest().request("PATCH", _ns_path(namespace, c.TXBROKER_PLURAL, name, group=c.GROUP) + "/status",
                       {"status": status}, content_type="application/merge-patch+json")
    except ApiError as e:
        if e.status != 404:   # deleted meanwhile
            raise
