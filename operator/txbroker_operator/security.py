"""A TxBroker's credentials and TLS, from the Secrets its spec names: what the broker pods mount,
and how the operator itself reaches the brokers' admin API.

spec.authSecretRef names a Secret with
    credentials.toml         the brokers' credentials and ACL file (secrets stored hashed; made with
                             `txbroker auth add-user`), mounted and passed as --auth-file
    operator-access-key,     credentials with the admin permission: the operator's, for the admin API
    operator-secret
    replication-access-key,  credentials with the replication permission: what slaves present to
    replication-secret       their master (required, so that scaling up needs no new Secret)
spec.tls.secretRef names a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt. Pods are
reached by IP, so certificates are checked against the headless Service's name: issue the
certificate for `<name>.<namespace>.svc`, `*.<name>.<namespace>.svc` and
`<name>-master.<namespace>.svc` (clients use the last).

Rotation: the brokers re-read the mounted files when they change (Kubernetes updates Secret volumes
in place), and the operator re-reads the Secrets on every pass, so neither needs a restart.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
import tempfile
import threading
from typing import Any, Mapping

import urllib3

from . import brokers, kube

AUTH_FILE_KEY = "credentials.toml"
OPERATOR_KEYS = ("operator-access-key", "operator-secret")
REPLICATION_KEYS = ("replication-access-key", "replication-secret")
TLS_KEYS = ("tls.crt", "tls.key", "ca.crt")


class SecretProblem(Exception):
    """A referenced Secret is missing or lacks a key; the message says which and what for."""


def _secret(namespace: str, name: str, keys: tuple[str, ...], what: str) -> dict[str, bytes]:
    obj = kube.get("Secret", namespace, name)
    if obj is None:
        raise SecretProblem(f"Secret {name} ({what}) does not exist in namespace {namespace}")
    data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    missing = [k for k in keys if not data.get(k)]
    if missing:
        raise SecretProblem(f"Secret {name} ({what}) lacks {', '.join(missing)}")
    return data


def server_name(broker: str, namespace: str) -> str:
    return f"{broker}.{namespace}.svc"


_cache: dict[tuple, brokers.Access] = {}
_cache_lock = threading.Lock()


def access_for(body: Mapping[str, Any]) -> brokers.Access:
    """How the operator reaches this TxBroker's admin API (plain HTTP without auth and TLS)."""
    spec, meta = body.get("spec") or {}, body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    auth_ref = (spec.get("authSecretRef") or {}).get("name")
    tls_ref = ((spec.get("tls") or {}).get("secretRef") or {}).get("name")
    if not auth_ref and not tls_ref:
        return brokers.PLAIN
    authorization, tls = "", None
    if auth_ref:
        data = _secret(ns, auth_ref, (AUTH_FILE_KEY, *OPERATOR_KEYS, *REPLICATION_KEYS), "spec.authSecretRef")
        token = base64.b64encode(data["operator-access-key"].strip() + b":" + data["operator-secret"].strip())
        authorization = "Basic " + token.decode()
    if tls_ref:
        tls = _secret(ns, tls_ref, TLS_KEYS, "spec.tls.secretRef")
    key = (ns, name, authorization, hashlib.sha256(b"".join(tls.values())).hexdigest() if tls else "")
    with _cache_lock:
        hit = _cache.get(key)
        if hit is None:
            hit = _cache[key] = _build(authorization, tls, server_name(name, ns))
        return hit


def _build(authorization: str, tls: dict[str, bytes] | None, hostname: str) -> brokers.Access:
    if tls is None:
        return brokers.Access(authorization=authorization)
    ctx = ssl.create_default_context(cadata=tls["ca.crt"].decode())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # The broker's certificate doubles as the operator's client certificate (the brokers may
    # require one under /api/); ssl wants files for it.
    with tempfile.NamedTemporaryFile("wb", suffix=".pem") as f:
        f.write(tls["tls.crt"] + b"\n" + tls["tls.key"])
        f.flush()
        ctx.load_cert_chain(f.name)
    pool = urllib3.PoolManager(num_pools=16, maxsize=4, retries=False, ssl_context=ctx,
                               server_hostname=hostname, assert_hostname=hostname)
    return brokers.Access(scheme="https", authorization=authorization, pool=pool)


GROUP_KEYS = ("access-key", "secret-key")


def group_credentials(namespace: str, name: str) -> tuple[str, str]:
    """A TxProducerGroup's credentialsSecretRef: the access key and secret its producers (or the
    coordinator of its jobs) authenticate with. The operator only checks it; the producers mount it."""
    data = _secret(namespace, name, GROUP_KEYS, "credentialsSecretRef")
    return data["access-key"].decode().strip(), data["secret-key"].decode().strip()
