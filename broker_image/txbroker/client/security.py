"""Client-side security options: credentials (SCRAM-SHA-256) and TLS.

    from txbroker.client import Credentials, TlsConfig, TransactionProducer
    TransactionProducer("order-service", "broker:10911", listener,
                        credentials=Credentials("order-service", secret),
                        tls=TlsConfig(ca_file="ca.pem", cert_file="client.pem", key_file="client.key"))

Every client class takes `credentials=` (a Credentials, or an (access_key, secret_key) pair) and
`tls=` (a TlsConfig, or True for TLS trusting the system's CAs). The secret never leaves the
process: SCRAM sends a proof derived from it, and checks that the broker knows the stored key too.
The `txbroker` command reads TXBROKER_ACCESS_KEY / TXBROKER_SECRET_KEY and TXBROKER_TLS_CA,
TXBROKER_TLS_CERT, TXBROKER_TLS_KEY (see `from_env`).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

from scramp import ScramClient, ScramException

from txbroker.client.errors import AuthenticationError, TlsHandshakeError, broker_error
from txbroker.protocol.bodies import ErrorBody, SaslRequest, SaslResponse, decoder, encode
from txbroker.protocol.codes import RequestCode, ResponseCode

MECHANISM = "SCRAM-SHA-256"
_response = decoder(SaslResponse)
_error = decoder(ErrorBody)


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)

    def __post_init__(self):
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need both an access key and a secret key")

    @classmethod
    def from_env(cls, environ=os.environ) -> "Credentials | None":
        """TXBROKER_ACCESS_KEY and TXBROKER_SECRET_KEY, or None if the access key is not set."""
        key = environ.get("TXBROKER_ACCESS_KEY", "")
        if not key:
            return None
        secret = environ.get("TXBROKER_SECRET_KEY", "")
        if not secret:
            raise ValueError("TXBROKER_ACCESS_KEY is set but TXBROKER_SECRET_KEY is not")
        return cls(key, secret)


@dataclass(frozen=True)
class TlsConfig:
    ca_file: str | None = None  # CA bundle to verify the broker with (None: the system's)
    cert_file: str | None = None  # client certificate, for brokers that require one
    key_file: str | None = None
    server_hostname: str | None = None  # the name to check the certificate against (default: the host)
    check_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = self.check_hostname
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    @classmethod
    def from_env(cls, environ=os.environ) -> "TlsConfig | None":
        """TXBROKER_TLS_CA (and TXBROKER_TLS_CERT, TXBROKER_TLS_KEY), or TXBROKER_TLS=1 for the system's CAs."""
        ca, cert, key = (environ.get(f"TXBROKER_TLS_{n}") or None for n in ("CA", "CERT", "KEY"))
        if not (ca or cert or environ.get("TXBROKER_TLS", "") in ("1", "true", "yes")):
            return None
        return cls(ca, cert, key)


def as_credentials(value) -> Credentials | None:
    if value is None or isinstance(value, Credentials):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return Credentials(*value)
    raise TypeError("credentials must be a txbroker.client.Credentials or an (access_key, secret_key) pair")


def as_tls(value) -> TlsConfig | None:
    if value is None or value is False:
        return None
    if value is True:
        return TlsConfig()
    if isinstance(value, TlsConfig):
        return value
    raise TypeError("tls must be a txbroker.client.TlsConfig, True or None")


def tls_error(address: str, e: BaseException) -> TlsHandshakeError:
    reason = getattr(e, "reason", None) or str(e)
    hint = ""
    if "WRONG_VERSION_NUMBER" in str(reason).upper() or "wrong version number" in str(e):
        hint = " (does the broker speak TLS? it may be plaintext only)"
    elif "CERTIFICATE_REQUIRED" in str(reason).upper():
        hint = " (the broker requires a client certificate: TlsConfig(cert_file=..., key_file=...))"
    elif "CERTIFICATE_VERIFY_FAILED" in str(reason).upper():
        hint = " (is TlsConfig.ca_file the CA that signed the broker's certificate?)"
    return TlsHandshakeError(f"TLS with {address} failed: {e}{hint}")


async def authenticate(conn, credentials: Credentials, timeout: float) -> str:
    """Run the SCRAM exchange on a fresh connection; returns the access key the broker confirmed.
    Raises AuthenticationError (refused, or the broker could not prove it knows the credentials)."""
    client = ScramClient([MECHANISM], credentials.access_key, credentials.secret_key)
    first = await _step(conn, client.get_client_first(), timeout)
    client.set_server_first(first.payload)
    final = await _step(conn, client.get_client_final(), timeout)
    try:
        client.set_server_final(final.payload)
    except ScramException as e:
        raise AuthenticationError(conn.address, "SASL_AUTHENTICATE", ResponseCode.UNAUTHORIZED,
                                  f"the broker did not prove it holds the credentials of "
                                  f"{credentials.access_key!r}: {e}") from None
    if not final.done:
        raise AuthenticationError(conn.address, "SASL_AUTHENTICATE", ResponseCode.UNAUTHORIZED,
                                  "the broker did not complete the authentication")
    return final.access_key


async def _step(conn, payload: str, timeout: float) -> SaslResponse:
    frame = await conn.call(RequestCode.SASL_AUTHENTICATE, encode(SaslRequest(MECHANISM, payload)), timeout)
    if frame.code != ResponseCode.SUCCESS:
        remark = _error.decode(frame.body).remark
        if frame.code not in (ResponseCode.UNAUTHORIZED, ResponseCode.TLS_REQUIRED):
            raise AuthenticationError(conn.address, "SASL_AUTHENTICATE", frame.code, remark)
        raise broker_error(conn.address, "SASL_AUTHENTICATE", frame.code, remark)
    return _response.decode(frame.body)
