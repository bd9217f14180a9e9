"""SASL_AUTHENTICATE: the two steps of a SCRAM-SHA-256 exchange that authenticate a connection.

A refusal (unknown key or wrong secret alike, expired, revoked, malformed) answers UNAUTHORIZED
with a remark saying why, counts in txbroker_auth_failures{reason}, and closes the connection.
"""

from txbroker.broker.auth.handshake import AuthFailure
from txbroker.broker.replies import Reply, error, ok
from txbroker.protocol.bodies import SaslRequest, SaslResponse, decoder
from txbroker.protocol.codes import ResponseCode


class SaslAuthenticateProcessor:
    def __init__(self, broker):
        self._decode = decoder(SaslRequest).decode
        self._auth = broker.auth

    def __call__(self, conn, body: bytes) -> Reply:
        auth = self._auth
        if auth is None:
            return error(ResponseCode.ILLEGAL_OPERATION,
                         "authentication is not enabled on this broker (it was started without --auth-file)")
        if conn.principal is not None:
            return error(ResponseCode.ILLEGAL_OPERATION,
                         f"this connection is already authenticated as {conn.principal.access_key!r}")
        req = self._decode(body)
        try:
            if conn.sasl is None:
                conn.sasl = auth.handshake()
                return ok(SaslResponse(conn.sasl.first(req.mechanism, req.payload)))
            principal, server_final = conn.sasl.final(req.payload)
        except AuthFailure as e:
            conn.sasl = None
            auth.failed(e.reason)
            return Reply(ResponseCode.UNAUTHORIZED, None, e.remark, close=True)
        conn.authenticated(principal)
        return ok(SaslResponse(server_final, True, principal.access_key))
