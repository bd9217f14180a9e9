"""Property tests (hypothesis) of the wire protocol and the request handlers.

Round trips of every body type; random and mutated frame streams through the decoder; random,
mutated and structurally valid-but-strange requests through a real in-process broker's
connection (tests/fuzz/harness.py), checking that nothing escapes, every answer is well formed,
nothing is answered SYSTEM_ERROR, and the broker still serves afterwards. The coverage-guided
counterpart is tests/fuzz/ (atheris); crashes either finds become regression tests here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import types

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
from harness import (  # noqa: E402
    ALL_BODY_TYPES, REQUEST_BODIES, InProcessBroker, cut_long_polls, decode_body_any, decode_stream,
)

from txbroker.protocol.bodies import decode, encode  # noqa: E402
from txbroker.protocol.framing import FLAG_ONEWAY, encode_frame  # noqa: E402

# ---- strategies: any body type, with values near the interesting edges -----------------------------

NAMES = st.sampled_from(["T", "T2", "Orders", "%RETRY%cg", "%DLQ%cg", "RMQ_SYS_TRANS_HALF_TOPIC",
                         "SCHEDULE_TOPIC_XXXX", "TRANS_CHECK_MAX_TIME_TOPIC", "pg", "cg", "tx1", "", "*"])
INTS = st.one_of(st.integers(-2, 40), st.sampled_from([2**31 - 1, -2**31, 2**63 - 1, -2**63, 2**64 - 1]),
                 st.integers(-2**63, 2**63 - 1))
MSG_IDS = st.one_of(st.sampled_from(["00000000000000020000", "00000000000000030000", "ffffffffffffffffffff",
                                     "0" * 19, "zz"]), st.text(max_size=24))


def strategy_for(tp, name: str = ""):
    origin = getattr(tp, "__origin__", None)
    if isinstance(tp, types.UnionType):  # e.g. list[str] | None
        return st.one_of(*(st.none() if t is type(None) else strategy_for(t, name) for t in tp.__args__))
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return struct_strategy(tp)
    if origin is list:
        return st.lists(strategy_for(tp.__args__[0], name), max_size=4)
    if origin is tuple:
        return st.tuples(*(strategy_for(t, name) for t in tp.__args__))
    if origin is dict:
        return st.dictionaries(strategy_for(tp.__args__[0]), strategy_for(tp.__args__[1]), max_size=3)
    if tp is str:
        if "msg_id" in name:
            return MSG_IDS
        if any(w in name for w in ("topic", "group", "transaction", "key", "name")):
            return st.one_of(NAMES, st.text(max_size=40))
        return st.one_of(st.just(""), st.text(max_size=40))
    if tp is bytes:
        return st.binary(max_size=64)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return INTS
    raise NotImplementedError(tp)


def struct_strategy(cls):
    hints = msgspec.structs.fields(cls)
    return st.builds(cls, **{f.name: strategy_for(f.type, f.name) for f in hints})


def any_request():
    return st.sampled_from(sorted(REQUEST_BODIES)).flatmap(
        lambda code: st.tuples(st.just(code), struct_strategy(REQUEST_BODIES[code])))


# ---- decoding ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ALL_BODY_TYPES, ids=lambda t: t.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_body_type_round_trips(kind, data):
    value = data.draw(struct_strategy(kind))
    assert decode(kind, encode(value)) == value


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_body_decoders_raise_only_decode_errors(data):
    decode_body_any(data)


def mutate(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for kind, pos, value in ops:
        if not b:
            b.append(value)
            continue
        i = pos % len(b)
        if kind == "flip":
            b[i] ^= 1 << (value % 8)
        elif kind == "set":
            b[i] = value
        elif kind == "insert":
            b.insert(i, value)
        elif kind == "delete":
            del b[i]
        elif kind == "truncate":
            del b[i:]
    return bytes(b)


MUTATIONS = st.lists(st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
                               st.integers(0, 10_000), st.integers(0, 255)), max_size=6)
FRAMES = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 65535), st.integers(0, 2**32 - 1),
                            st.binary(max_size=300)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(FRAMES, MUTATIONS, st.lists(st.integers(1, 64), max_size=10))
def test_mutated_frame_streams_never_break_the_decoder(frames, ops, chunks):
    stream = mutate(b"".join(encode_frame(*f) for f in frames), ops)
    decode_stream(stream, chunks)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(1, 32), max_size=10))
def test_random_streams_never_break_the_decoder(data, chunks):
    decode_stream(data, chunks)


# ---- the handlers of a real broker ------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker():
    b = InProcessBroker(auth=True)
    yield b
    b.close()


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


@FUZZ
@given(st.lists(any_request(), min_size=1, max_size=6), st.booleans(), st.booleans())
def test_structured_requests_are_answered_without_internal_errors(broker, requests, authenticated, oneway):
    frames = [encode_frame(FLAG_ONEWAY if oneway else 0, code, i + 1, cut_long_polls(code, encode(body)))
              for i, (code, body) in enumerate(requests)]
    answers = broker.feed([b"".join(frames)], authenticated)
    if not oneway and authenticated:
        assert {a.opaque for a in answers if a.is_response} <= set(range(1, len(frames) + 1))
    assert broker.still_serves()


@FUZZ
@given(any_request(), MUTATIONS, st.booleans())
def test_mutated_requests_are_answered_without_internal_errors(broker, request, ops, authenticated):
    code, body = request
    frame = encode_frame(0, code, 1, cut_long_polls(code, mutate(encode(body), ops)))
    broker.feed([frame], authenticated)
    assert broker.still_serves()


@FUZZ
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=4), st.booleans())
def test_random_bytes_are_answered_without_internal_errors(broker, chunks, authenticated):
    broker.feed(chunks, authenticated)
    assert broker.still_serves()


# ---- every message property the broker parses -------------------------------------------------------

from txbroker.protocol import names  # noqa: E402
from txbroker.protocol.bodies import Message, SendRequest  # noqa: E402
from txbroker.protocol.codes import RequestCode, ResponseCode  # noqa: E402
from txbroker.store.db import last_key  # noqa: E402
from txbroker.store.keys import lsn_from_key  # noqa: E402

PROPERTIES = sorted(v for k, v in vars(names).items() if k.startswith("PROPERTY_"))
VALUES = st.one_of(st.text(max_size=12), st.sampled_from(["30", "0", "-1", "1.5", "30s", "nan", "inf", "-inf", "1e400",
                                                          " 7 ", "", "9" * 30, "0x10"]),
                   st.integers(-2**63, 2**63).map(str), st.floats(allow_nan=True).map(str))
_sent = iter(range(10**9))


@pytest.fixture(scope="module")
def master():
    """A broker of its own: the fuzzed requests above may depose theirs (a heartbeat naming a higher epoch)."""
    b = InProcessBroker(auth=True)
    yield b
    b.close()


@FUZZ
@given(st.dictionaries(st.sampled_from(PROPERTIES), VALUES, min_size=1, max_size=4), st.booleans())
def test_a_message_property_is_taken_or_refused_before_anything_is_written(master, properties, half):
    """Second review, defect 5: CHECK_IMMUNITY_TIME_IN_SECONDS="30s" failed while its record was being
    applied (SYSTEM_ERROR), after the record had joined the write batch and moved the log end, so
    replication never shipped it and every later SYNC write timed out. Any value of any property
    the broker reads is taken or refused whole: never SYSTEM_ERROR, and the log end is always the
    last record written."""
    state = master.broker.state
    body = SendRequest("pg", [Message("T", b"x", properties=properties)], f"fz-{next(_sent)}" if half else "")
    answers = master.feed([encode_frame(0, RequestCode.SEND_MESSAGE, 1, encode(body))], authenticated=True)
    (answer,) = answers
    assert answer.code in (ResponseCode.SUCCESS, ResponseCode.MESSAGE_ILLEGAL), answer
    assert lsn_from_key(last_key(state.db.log)) == state.next_lsn - 1 == state.local_durable_lsn
    assert master.still_serves()
