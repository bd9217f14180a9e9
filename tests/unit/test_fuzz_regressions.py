"""Crashes the fuzzers found, kept as regression tests (the record is tests/fuzz/README.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
from harness import InProcessBroker  # noqa: E402

from txbroker.protocol.bodies import ErrorBody, HeartbeatRequest, decode, encode  # noqa: E402
from txbroker.protocol.codes import RequestCode, ResponseCode  # noqa: E402
from txbroker.protocol.framing import encode_frame  # noqa: E402


@pytest.fixture(scope="module")
def broker():
    b = InProcessBroker(auth=True)
    yield b
    b.close()


@pytest.mark.parametrize("code,body", [
    (RequestCode.VIEW_MESSAGE_BY_ID, b"\x91\xa2\xb0\xb0"),  # ViewMessageRequest(msg_id=<not UTF-8>)
    (RequestCode.PULL_MESSAGE, b"\x93\xa1\xa0\x00\x00"),  # PullRequest(topic=<not UTF-8>, 0, 0)
    (RequestCode.SASL_AUTHENTICATE, b"\x92\xa1\xff\xa0"),  # SaslRequest(mechanism=<not UTF-8>, "")
])
def test_invalid_utf8_in_a_string_is_malformed_not_an_internal_error(broker, code, body):
    """hypothesis: msgspec raises UnicodeDecodeError, not DecodeError, for a string that is not
    UTF-8; every handler answered it SYSTEM_ERROR instead of MESSAGE_ILLEGAL."""
    authenticated = code != RequestCode.SASL_AUTHENTICATE  # SASL is for connections not yet authenticated
    (answer,) = broker.feed([encode_frame(0, code, 3, body)], authenticated)
    assert answer.code == ResponseCode.MESSAGE_ILLEGAL
    assert "not valid UTF-8" in decode(ErrorBody, answer.body).remark
    assert broker.still_serves()


@pytest.mark.parametrize("address", ["jr{", "host", "host:99999", ":10911"])
def test_a_heartbeat_naming_a_malformed_newer_master_is_refused(broker, address):
    """hypothesis: a heartbeat whose newer-master hint was not HOST:PORT was answered SUCCESS, and
    the broker's background check of the hint then died on the address ("Task exception was never
    retrieved"). The hint is now checked with the heartbeat, and the master stays master."""
    body = encode(HeartbeatRequest("c", ["pg"], master_epoch=7, master_address=address))
    (answer,) = broker.feed([encode_frame(0, RequestCode.HEARTBEAT, 4, body)], authenticated=True)
    assert answer.code == ResponseCode.MESSAGE_ILLEGAL
    assert f"heartbeat master_address must be HOST:PORT, got {address!r}" in decode(ErrorBody, answer.body).remark
    assert broker.still_serves()
