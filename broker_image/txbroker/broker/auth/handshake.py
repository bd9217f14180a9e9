"""The server side of one SCRAM-SHA-256 exchange (scramp does the protocol; this maps its outcomes
to our refusal reasons).

    client-first  ->  server-first        (SASL_AUTHENTICATE, step 1)
    client-final  ->  server-final        (step 2: the proof is checked; the connection is authenticated)

No access key is refused at step 1: an unknown one gets a decoy salt (decoy.py), a revoked or
expired one its real salt, so step 1 answers alike for every key and nobody learns which keys
exist. Step 2 refuses. Only a client whose proof is valid, and so holds the secret, is told that
its credentials are revoked or expired; anyone else gets the wrong-secret answer. The metrics
reason is always the true one (it is for the operator, not the client).
"""

from __future__ import annotations

from typing import Callable

from scramp import ScramException, ScramMechanism
from scramp.utils import ServerError

from txbroker.broker.auth.acl import Principal
from txbroker.broker.auth.scram_secret import MECHANISM, ScramSecret

_mechanism = ScramMechanism(MECHANISM)


class AuthFailure(Exception):
    """`reason` is the metrics label (unknown_key, wrong_secret, expired, revoked, malformed, mechanism);
    `remark` the answer the client gets. Unknown key and wrong secret answer alike on purpose."""

    def __init__(self, reason: str, remark: str):
        super().__init__(remark)
        self.reason = reason
        self.remark = remark


def invalid_credentials(access_key: str) -> str:
    return f"authentication failed for access key {access_key!r}: unknown access key or wrong secret"


def refusal(reason: str, access_key: str, holds_secret: bool) -> AuthFailure:
    """The refusal of a key that may not log in (unknown_key, revoked, expired); why is said only to
    a client that proved it holds the secret."""
    if holds_secret and reason == "revoked":
        return AuthFailure(reason, f"credentials of access key {access_key!r} are revoked")
    if holds_secret and reason == "expired":
        return AuthFailure(reason, f"credentials of access key {access_key!r} expired")
    return AuthFailure(reason, invalid_credentials(access_key))


def barred(p: Principal) -> str:
    """Why `p` may not log in now ("revoked", "expired"), or ""."""
    return "revoked" if p.disabled else "expired" if p.expired() else ""


class ScramHandshake:
    def __init__(self, lookup: Callable[[str], Principal | None], decoy: Callable[[str], ScramSecret]):
        self._lookup = lookup
        self._decoy = decoy
        self._server = _mechanism.make_server(self._auth_info)
        self._access_key = ""
        self._barred = ""  # unknown_key, revoked or expired: refused at step 2 whatever the proof
        self.principal: Principal | None = None

    def _auth_info(self, access_key: str):
        self._access_key = access_key
        p = self._lookup(access_key)
        if p is None:
            self._barred = "unknown_key"
            s = self._decoy(access_key)
        else:
            self._barred = barred(p)
            self.principal = p
            s = p.secret
        return s.salt, s.stored_key, s.server_key, s.iterations

    def first(self, mechanism: str, client_first: str) -> str:
        if mechanism != MECHANISM:
            raise AuthFailure("mechanism", f"unsupported SASL mechanism {mechanism!r}: this broker offers {MECHANISM}")
        try:
            self._server.set_client_first(client_first)
            return self._server.get_server_first()
        except ScramException as e:
            raise AuthFailure("malformed", f"malformed SCRAM message: {e}") from None

    def final(self, client_final: str) -> tuple[Principal, str]:
        try:
            self._server.set_client_final(client_final)
        except ScramException as e:
            if e.server_error is not ServerError.INVALID_PROOF:
                raise AuthFailure("malformed", f"malformed SCRAM message: {e}") from None
            if self._barred:
                raise refusal(self._barred, self._access_key, holds_secret=False) from None
            raise AuthFailure("wrong_secret", invalid_credentials(self._access_key)) from None
        if self._barred:
            raise refusal(self._barred, self._access_key, holds_secret=True)
        return self.principal, self._server.get_server_final()
