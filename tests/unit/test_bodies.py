"""Request bodies: round trips, and malformed bodies raise errors that name the field."""

import msgspec
import pytest
from hypothesis import given, strategies as st

from txbroker.protocol.bodies import EndTransactionRequest, Message, SendRequest, decode, encode

text = st.text(max_size=30)
messages = st.builds(Message, topic=text, body=st.binary(max_size=100), tags=text, keys=text,
                     properties=st.dictionaries(text, text, max_size=3), queue_id=st.integers(-1, 100))


@given(st.builds(SendRequest, producer_group=text, messages=st.lists(messages, max_size=5), transaction_id=text))
def test_send_request_round_trip(req):
    assert decode(SendRequest, encode(req)) == req


def test_wrong_type_names_the_field():
    bad = encode(["group", "txid", "not-a-state"])
    with pytest.raises(msgspec.ValidationError, match=r"\$\[2\]"):
        decode(EndTransactionRequest, bad)


def test_garbage_is_a_decode_error():
    with pytest.raises(msgspec.DecodeError):
        decode(SendRequest, b"\xc1\xff\x00")
