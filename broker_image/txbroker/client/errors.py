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
