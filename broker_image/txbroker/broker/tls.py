"""TLS for the data plane, the admin plane and replication, from certificate files.

  tls_cert, tls_key   the broker's certificate chain and key (PEM), for both planes; also presented
                      as the client certificate when a slave replicates from a master
  tls_client_ca       CA bundle for client certificates. Given, the data plane requires a client
                      certificate signed by it; the admin plane asks for one and requires it under
                      /api/ (health, readiness and metrics stay reachable by probes and scrapers,
                      which present none)
  tls_ca              CA bundle a slave uses to verify its master; given, replication uses TLS

Contexts are built once and refreshed in place when the files change (cert rotation): new
handshakes use the new certificate, established connections keep theirs.
"""

from __future__ import annotations

import logging
import ssl

log = logging.getLogger(__name__)


class TlsError(ValueError):
    """A certificate, key or CA file is missing or unusable; the message names it."""


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    try:
        ctx.load_cert_chain(cert, key)
    except FileNotFoundError as e:
        raise TlsError(f"TLS file {e.filename} does not exist") from None
    except (ssl.SSLError, OSError) as e:
        raise TlsError(f"cannot load TLS certificate {cert} with key {key}: {e}") from None


def _load_ca(ctx: ssl.SSLContext, ca: str, what: str) -> None:
    try:
        ctx.load_verify_locations(ca)
    except FileNotFoundError:
        raise TlsError(f"{what} {ca} does not exist") from None
    except (ssl.SSLError, OSError) as e:
        raise TlsError(f"cannot load {what} {ca}: {e}") from None


def server_context(cert: str, key: str, client_ca: str = "", client_cert: str = "required") -> ssl.SSLContext:
    """`client_cert`: "required" (data plane) or "optional" (admin plane) when `client_ca` is given."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert, key)
    if client_ca:
        _load_ca(ctx, client_ca, "client CA file")
        ctx.verify_mode = ssl.CERT_REQUIRED if client_cert == "required" else ssl.CERT_OPTIONAL
    return ctx


def client_context(ca: str, cert: str = "", key: str = "") -> ssl.SSLContext:
    """For a slave connecting to its master: verify the master with `ca`, present `cert` if given."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca:
        _load_ca(ctx, ca, "CA file")
    if cert:
        _load_chain(ctx, cert, key)
    return ctx


class BrokerTls:
    """The broker's TLS contexts, built from its configuration (None members: TLS off there)."""

    def __init__(self, config):
        self._config = config
        self.data: ssl.SSLContext | None = None
        self.admin: ssl.SSLContext | None = None
        self.replication: ssl.SSLContext | None = None
        if config.tls_cert:
            self.data = server_context(config.tls_cert, config.tls_key, config.tls_client_ca, "required")
            self.admin = server_context(config.tls_cert, config.tls_key, config.tls_client_ca, "optional")
        if config.tls_ca:
            self.replication = client_context(config.tls_ca, config.tls_cert, config.tls_key)

    @property
    def files(self) -> list[str]:
        c = self._config
        return [f for f in (c.tls_cert, c.tls_key, c.tls_client_ca, c.tls_ca) if f]

    def reload(self) -> None:
        """Load the files again into the same contexts (rotation). Raises TlsError; the contexts then
        keep what they had."""
        c = self._config
        for ctx in (self.data, self.admin):
            if ctx is not None:
                _load_chain(ctx, c.tls_cert, c.tls_key)
                if c.tls_client_ca:
                    _load_ca(ctx, c.tls_client_ca, "client CA file")
        if self.replication is not None:
            _load_ca(self.replication, c.tls_ca, "CA file")
            if c.tls_cert:
                _load_chain(self.replication, c.tls_cert, c.tls_key)
        log.warning("TLS certificates reloaded from %s", ", ".join(self.files))
