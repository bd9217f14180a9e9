"""Client errors. Each names the broker, the request and, for refusals, the response code."""

from __future__ import annotations

from txbroker.protocol.codes import ResponseCode, code_name


class ClientError(Exception):
    """Base of every error the client raises."""


class BrokerError(ClientError):
    """The broker answered with an error code."""

    def __init__(self, broker: str, request: str, code: int, remark: str):
        self.broker = broker
        self.request = request
        self.code = code
        self.remark = remark
        super().__init__(f"{request} to {broker} failed with {code_name(code)} ({code}): {remark}")

    @property
    def code_name(self) -> str:
        return code_name(self.code)

    def is_(self, *codes: ResponseCode) -> bool:
        return self.code in codes


class BrokerUnavailable(ClientError):
    """No broker could be reached within the deadline."""


class RequestTimeout(ClientError):
    """The broker did not answer in time; the request may or may not have taken effect."""


class DecisionNotReplicated(RequestTimeout):
    """A job decision the master stored but its slaves did not acknowledge within the request timeout
    (SYNC replication): not refused, not promised. It takes effect once the slaves have it, and is
    gone if a failover takes the master's unreplicated writes away; describing the job, or repeating
    the same decision, tells which."""


class AuthenticationError(BrokerError):
    """The broker refused the credentials (none given, unknown access key or wrong secret, expired,
    revoked), or would not prove it knows them. Not retried: the same credentials fail again."""


class TlsRequired(BrokerError):
    """The broker accepts TLS connections only and this client connected in plaintext."""


class TlsHandshakeError(ClientError):
    """TLS could not be set up: the broker's certificate is not trusted or does not name it, the
    broker requires a client certificate, or the broker does not speak TLS."""


def broker_error(broker: str, request: str, code: int, remark: str) -> BrokerError:
    """The BrokerError subclass that says most about `code`."""
    if code == ResponseCode.UNAUTHORIZED:
        return AuthenticationError(broker, request, code, remark)
    if code == ResponseCode.TLS_REQUIRED:
        return TlsRequired(broker, request, code, remark)
    return BrokerError(broker, request, code, remark)
