"""Who is asking, and what the console lets them do.

When the brokers require authentication (an unauthenticated GET /api/v1/whoami answers 401; a broker
that cannot be asked counts as requiring it), every page of the console asks for HTTP Basic
credentials (the brokers' access key and secret) and has the brokers check them: whoami with them
must answer, as an admin (reads and actions) or a monitor (reads; the console shows no action and
refuses any). The console keeps no users of its own and never serves anything to an unauthenticated
visitor then. Views are read with the service account (--access-key) when one is given, else with
the visitor's credentials; actions always carry the visitor's own, so the brokers decide them.

Every POST carries a CSRF token bound to the visitor's credentials (an HMAC under a key made when the
console starts), and, if the browser sends an Origin, it must be the console's own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import time
from dataclasses import dataclass

from txbroker.client.admin import AdminError
from txbroker.client.errors import ClientError
from txbroker.client.security import Credentials

_CACHE_SECONDS = 30.0


@dataclass(frozen=True)
class Visitor:
    access_key: str  # empty: the brokers require no authentication
    credentials: Credentials | None  # the visitor's own (None without authentication)
    can_write: bool
    can_read: bool

    @property
    def label(self) -> str:
        return self.access_key or "anonymous (the brokers require no authentication)"


class Refused(Exception):
    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


def basic_credentials(header: str) -> Credentials | None:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        key, sep, secret = base64.b64decode(token, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return Credentials(key, secret) if sep and key and secret else None


class Gate:
    def __init__(self, cluster):
        self.cluster = cluster
        self._key = os.urandom(32)
        self._required: tuple[float, bool] | None = None
        self._verified: dict[bytes, tuple[float, Visitor]] = {}

    async def auth_required(self) -> bool:
        now = time.monotonic()
        if self._required is not None and now - self._required[0] < _CACHE_SECONDS:
            return self._required[1]
        required = True  # nobody answered: fail closed
        for url in self.cluster.admin_urls:
            try:
                await self.cluster.call(url, None, "whoami")
                required = False
                break
            except AdminError as e:
                if e.status == 401:
                    break
            except ClientError:
                continue
        self._required = (now, required)
        return required

    async def visitor(self, authorization: str) -> Visitor:
        """The visitor of a request with this Authorization header, or Refused(401|403)."""
        if not await self.auth_required():
            return Visitor("", None, True, True)
        creds = basic_credentials(authorization)
        if creds is None:
            raise Refused(401, "the brokers require authentication: log in with your access key and secret")
        digest = hashlib.sha256(authorization.encode()).digest()
        now = time.monotonic()
        hit = self._verified.get(digest)
        if hit is not None and now - hit[0] < _CACHE_SECONDS:
            return hit[1]
        me = None
        for url in self.cluster.admin_urls:
            try:
                me = await self.cluster.call(url, creds, "whoami")
                break
            except AdminError as e:
                if e.status in (401, 403):
                    raise Refused(401, f"the brokers refused these credentials: {e}") from None
            except ClientError:
                continue
        if me is None:
            raise Refused(503, "no broker answered to check the credentials")
        if not (me.admin or me.monitor):
            raise Refused(403, f"access key {creds.access_key!r} may not read the admin API "
                               "(it needs the admin or monitor permission)")
        visitor = Visitor(creds.access_key, creds, me.admin, True)
        if len(self._verified) > 1000:
            self._verified.clear()
        self._verified[digest] = (now, visitor)
        return visitor

    def csrf_token(self, visitor: Visitor) -> str:
        secret = visitor.credentials.secret_key if visitor.credentials else ""
        msg = f"{visitor.access_key}\0{secret}".encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def check_csrf(self, visitor: Visitor, token: str) -> bool:
        return hmac.compare_digest(self.csrf_token(visitor), token or "")
