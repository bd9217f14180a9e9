"""The server side of one SCRAM-SHA-256 exchange (scramp does the protocol; this maps its outcomes
to our refusal reasons).

    client-first  ->  server-first        (SASL_AUTHENTICATE, step 1)
    client-final  ->  server-final        (step 2: the proof is checked; the connection is authenticated)
"""

from __future__ import annotations

from typing import Callable

from scramp import ScramException, ScramMechanism
from scramp.utils import ServerError

from txbroker.broker.auth.acl import Principal
from txbroker.broker.auth.scram_secret import MECHANISM

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


class ScramHandshake:
    def __init__(self, lookup: Callable[[str], Principal | None]):
        self._lookup = lookup
        self._server = _mechanism.make_server(self._auth_info)
        self._access_key = ""
        self._refused: AuthFailure | None = None
        self.principal: Principal | None = None

    def _auth_info(self, access_key: str):
        self._access_key = access_key
        p = self._lookup(access_key)
        if p is None:
            self._refused = AuthFailure("unknown_key", invalid_credentials(access_key))
            return None
        if p.disabled:
            self._refused = AuthFailure("revoked", f"credentials of access key {access_key!r} are revoked")
            return None
        if p.expired():
            self._refused = AuthFailure("expired", f"credentials of access key {access_key!r} expired")
            return None
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
            raise self._failure(e) from None

    def final(self, client_final: str) -> tuple[Principal, str]:
        try:
            self._server.set_client_final(client_final)
            return self.principal, self._server.get_server_final()
        except ScramException as e:
            raise self._failure(e) from None

    def _failure(self, e: ScramException) -> AuthFailure:
        if self._refused is not None:
            return self._refused
        if e.server_error is ServerError.INVALID_PROOF:
            return AuthFailure("wrong_secret", invalid_credentials(self._access_key))
        return AuthFailure("malformed", f"malformed SCRAM message: {e}")
