"""Credentials and TLS for the client commands: global flags, or the environment.

    --access-key / TXBROKER_ACCESS_KEY     with the secret from TXBROKER_SECRET_KEY or --secret-file
    --tls-ca / TXBROKER_TLS_CA             CA bundle to verify the broker (turns TLS on)
    --tls-cert, --tls-key / TXBROKER_TLS_CERT, TXBROKER_TLS_KEY   client certificate
    --tls / TXBROKER_TLS=1                 TLS with the system's CAs

The secret is never a flag: command lines show up in `ps` and shell histories.
"""

from __future__ import annotations

import argparse
import os

from txbroker.client.admin import AdminClient
from txbroker.client.security import Credentials, TlsConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("credentials and TLS (for brokers that require them)")
    g.add_argument("--access-key", default=os.environ.get("TXBROKER_ACCESS_KEY"),
                   help="access key (env TXBROKER_ACCESS_KEY); the secret comes from TXBROKER_SECRET_KEY or --secret-file")
    g.add_argument("--secret-file", help="file holding the secret of --access-key")
    g.add_argument("--tls", action="store_true", default=os.environ.get("TXBROKER_TLS", "") in ("1", "true", "yes"),
                   help="connect with TLS, trusting the system's CAs (env TXBROKER_TLS=1)")
    g.add_argument("--tls-ca", default=os.environ.get("TXBROKER_TLS_CA"),
                   help="CA bundle to verify the broker with; turns TLS on (env TXBROKER_TLS_CA)")
    g.add_argument("--tls-cert", default=os.environ.get("TXBROKER_TLS_CERT"),
                   help="client certificate, for brokers that require one (env TXBROKER_TLS_CERT)")
    g.add_argument("--tls-key", default=os.environ.get("TXBROKER_TLS_KEY"),
                   help="key of --tls-cert (env TXBROKER_TLS_KEY)")


def credentials(args) -> Credentials | None:
    key = getattr(args, "access_key", None)
    if not key:
        return None
    if getattr(args, "secret_file", None):
        with open(args.secret_file) as f:
            secret = f.read().rstrip("\r\n")
    else:
        secret = os.environ.get("TXBROKER_SECRET_KEY", "")
    if not secret:
        raise ValueError(f"access key {key!r} given but no secret: set TXBROKER_SECRET_KEY or --secret-file")
    return Credentials(key, secret)


def tls(args) -> TlsConfig | None:
    ca, cert, key = getattr(args, "tls_ca", None), getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if not (ca or cert or getattr(args, "tls", False)):
        return None
    return TlsConfig(ca_file=ca, cert_file=cert, key_file=key)


def client_options(args) -> dict:
    """Keyword arguments for the client classes (credentials=..., tls=...)."""
    return {"credentials": credentials(args), "tls": tls(args)}


def admin_client(args) -> AdminClient:
    return AdminClient(args.admin, **client_options(args))
