"""What a request handler returns: a response code with a body or a remark, possibly held
until the change it reports is durable."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from msgspec import Struct

from txbroker.protocol.codes import ResponseCode


@dataclass(slots=True)
class Reply:
    code: int
    body: Struct | None = None
    remark: str = ""
    durable: asyncio.Future | None = None  # answer only once this resolves
    close: bool = False  # close the connection once answered (authentication refused)


def ok(body: Struct | None = None, durable: asyncio.Future | None = None) -> Reply:
    return Reply(ResponseCode.SUCCESS, body, "", durable)


def error(code: ResponseCode, remark: str) -> Reply:
    return Reply(code, None, remark)


class RequestError(Exception):
    """Raised inside a handler to answer with `code` and `remark`."""

    def __init__(self, code: ResponseCode, remark: str):
        super().__init__(remark)
        self.code = code
        self.remark = remark
