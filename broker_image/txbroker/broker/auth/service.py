"""The broker's authentication service: the principals in force, reloading them, admitting each
request of a connection, and checking HTTP Basic credentials for the admin plane.

A reload builds a new table; a principal whose entry did not change is kept (same object, warm
caches). A connection remembers the principal it authenticated as, and each request is admitted
by one dict lookup: if the table now holds another object for that key, the credentials were
revoked, disabled or re-keyed (the connection is refused and closed), or only the permissions
changed (the connection carries on with the new ones). Expiry is checked on every request of a
principal that has one.
"""

from __future__ import annotations

import hashlib
import logging
import time
from txbroker.protocol.admin import AuthStatus
from txbroker.broker.auth.acl import Principal
from txbroker.broker.auth.credentials import CredentialsError, load_credentials
from txbroker.broker.auth.decoy import Decoys
from txbroker.broker.auth.handshake import AuthFailure, ScramHandshake, barred, invalid_credentials, refusal
from txbroker.broker.replies import Reply
from txbroker.protocol.codes import ResponseCode

log = logging.getLogger(__name__)

AUTH_REQUIRED = ("authentication required: this broker accepts authenticated connections only "
                 "(SCRAM-SHA-256 with an access key and secret; configure the client's credentials)")
_BASIC_CACHE_MAX = 1024


class AuthService:
    def __init__(self, path: str, metrics):
        self.path = path
        self._metrics = metrics
        self.principals: dict[str, Principal] = {}
        self.loaded_at = 0.0
        self.reloads = 0
        self.last_error = ""
        self._basic_ok: dict[tuple[str, bytes], Principal] = {}
        self._install(load_credentials(path))  # a broken file at start is fatal (CredentialsError)

    # ---- the table ----------------------------------------------------------------------------

    def _install(self, fresh: dict[str, Principal]) -> tuple[list[str], list[str], list[str]]:
        old = self.principals
        table: dict[str, Principal] = {}
        added, changed = [], []
        for key, p in fresh.items():
            before = old.get(key)
            if before is not None and before.same_as(p):
                table[key] = before
                continue
            p.on_denied = self._metrics.access_denied_hook
            table[key] = p
            (changed if before is not None else added).append(key)
        removed = [k for k in old if k not in fresh]
        self.principals = table
        self._decoys = Decoys(p.secret for p in table.values())
        self._basic_ok = {}
        self.loaded_at = time.time()
        return added, changed, removed

    def reload(self) -> bool:
        """Read the file again; on any error keep the principals in force and say why."""
        try:
            fresh = load_credentials(self.path)
        except CredentialsError as e:
            self.last_error = str(e)
            self._metrics.credentials_reloads.labels("failed").inc()
            log.error("credentials not reloaded, keeping the %d users in force: %s", len(self.principals), e)
            return False
        added, changed, removed = self._install(fresh)
        self.reloads += 1
        self.last_error = ""
        self._metrics.credentials_reloads.labels("ok").inc()
        log.warning("credentials reloaded from %s: %d users (added %s, changed %s, removed %s)", self.path,
                    len(self.principals), added or "none", changed or "none", removed or "none")
        return True

    def lookup(self, access_key: str) -> Principal | None:
        return self.principals.get(access_key)

    # ---- the data plane -----------------------------------------------------------------------

    def handshake(self) -> ScramHandshake:
        return ScramHandshake(self.lookup, self._decoys.secret)

    def failed(self, reason: str) -> None:
        self._metrics.auth_failures.labels(reason).inc()

    def admit(self, conn) -> Reply | None:
        """None if the connection may make a request now; otherwise the refusal (close after it)."""
        p = conn.principal
        if p is None:
            self.failed("no_credentials")
            return Reply(ResponseCode.UNAUTHORIZED, None, AUTH_REQUIRED)
        current = self.principals.get(p.access_key)
        if current is not p:
            refusal = self._adopt(conn, p, current)
            if refusal is not None:
                return refusal
            p = current
        if p.expires_at and time.time() >= p.expires_at:
            self.failed("expired")
            return Reply(ResponseCode.UNAUTHORIZED, None, f"credentials of access key {p.access_key!r} expired")
        return None

    def _adopt(self, conn, p: Principal, current: Principal | None) -> Reply | None:
        if current is None or current.disabled or current.secret != p.secret:
            self.failed("revoked")
            return Reply(ResponseCode.UNAUTHORIZED, None,
                         f"credentials of access key {p.access_key!r} were revoked or changed; authenticate again")
        conn.authenticated(current)  # only the permissions (or expiry) changed
        return None

    def valid(self, p: Principal | None) -> bool:
        """Whether a connection authenticated as `p` may still be sent check-backs and the like."""
        if p is None:
            return False
        current = self.principals.get(p.access_key)
        if current is not p and (current is None or current.disabled or current.secret != p.secret):
            return False
        return not current.expired()

    # ---- the admin plane ----------------------------------------------------------------------

    def verify_basic(self, access_key: str, secret: str) -> Principal | AuthFailure:
        """Check HTTP Basic credentials against the stored hash. A success is remembered (by a
        digest of the secret) until the next reload, so PBKDF2 runs once per client, not per call.
        As in the SCRAM exchange, an unknown key costs the same PBKDF2 as a wrong secret (against its
        decoy), and only a caller holding the secret is told it is revoked or expired."""
        p = self.principals.get(access_key)
        if p is None:
            self._decoys.secret(access_key).verify(secret)  # no timing difference from a wrong secret
            return refusal("unknown_key", access_key, holds_secret=False)
        key = (access_key, hashlib.sha256(secret.encode()).digest())
        holds = self._basic_ok.get(key) is p or p.secret.verify(secret)
        why = barred(p)
        if why:
            return refusal(why, access_key, holds)
        if not holds:
            return AuthFailure("wrong_secret", invalid_credentials(access_key))
        if len(self._basic_ok) >= _BASIC_CACHE_MAX:
            self._basic_ok.clear()
        self._basic_ok[key] = p
        return p

    def status(self) -> AuthStatus:
        return AuthStatus(self.path, len(self.principals), round(self.loaded_at, 3), self.reloads, self.last_error or "")


__all__ = ["AUTH_REQUIRED", "AuthFailure", "AuthService"]
