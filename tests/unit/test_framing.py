"""The frame decoder: round trips, split delivery, and bad frames (property-tested)."""

from hypothesis import given, settings, strategies as st

from txbroker.protocol.framing import FLAG_RESPONSE, Frame, FrameDecoder, FrameError, encode_frame

MAX = 1024


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 65535), st.integers(0, 2**32 - 1),
                          st.binary(max_size=200)), max_size=20),
       st.integers(1, 64))
def test_frames_survive_any_split(frames, chunk):
    stream = b"".join(encode_frame(*f) for f in frames)
    dec = FrameDecoder(MAX)
    out = []
    for i in range(0, len(stream), chunk):
        out.extend(dec.feed(stream[i:i + chunk]))
    assert [(f.flags, f.code, f.opaque, f.body) for f in out] == frames


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_random_bytes_never_raise(data):
    dec = FrameDecoder(MAX)
    for item in dec.feed(data):
        assert isinstance(item, (Frame, FrameError))


def test_oversize_frame_is_skipped_and_the_stream_goes_on():
    dec = FrameDecoder(MAX)
    big = encode_frame(0, 10, 7, b"x" * (MAX + 10))
    small = encode_frame(0, 34, 8, b"ok")
    out = dec.feed(big[:500]) + dec.feed(big[500:] + small)
    assert isinstance(out[0], FrameError) and not out[0].fatal and out[0].opaque == 7
    assert "maximum frame size" in out[0].reason
    assert isinstance(out[1], Frame) and out[1].opaque == 8 and out[1].body == b"ok"


def test_wrong_version_is_fatal():
    frame = bytearray(encode_frame(FLAG_RESPONSE, 0, 1, b""))
    frame[4] = 99
    (err,) = FrameDecoder(MAX).feed(bytes(frame))
    assert isinstance(err, FrameError) and err.fatal and "version 99" in err.reason


def test_partial_frame_waits_for_the_rest():
    dec = FrameDecoder(MAX)
    frame = encode_frame(0, 10, 3, b"hello")
    assert dec.feed(frame[:-1]) == []
    (f,) = dec.feed(frame[-1:])
    assert f.body == b"hello"


def test_nothing_is_decoded_after_a_fatal_error():
    """Regression (hypothesis, tests/unit/test_fuzz_protocol.py): a first frame whose length was
    corrupted to an implausible size was reported fatal, but the next feed decoded the rest of the
    garbage as frames."""
    stream = bytearray(encode_frame(0, 0, 0, b"") * 2)
    stream[0] ^= 1
    dec = FrameDecoder(4096)
    (err,) = dec.feed(bytes(stream[:12]))
    assert isinstance(err, FrameError) and err.fatal
    assert dec.feed(bytes(stream[12:])) == [] and dec.feed(encode_frame(0, 34, 1, b"ok")) == []


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 65535), st.integers(0, 2**32 - 1),
                          st.binary(max_size=1500)), max_size=6),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
       st.lists(st.integers(1, 4000), max_size=6))
def test_whole_reads_decode_as_byte_by_byte_reads_do(frames, flips, cuts):
    """Reads of whole frames skip the buffer (framing.py's fast path); reads of anything else,
    frames too large, damaged or cut anywhere, must come out exactly as one byte at a time does."""
    stream = bytearray(b"".join(encode_frame(*f) for f in frames))
    for pos, value in flips:
        if stream:
            stream[pos % len(stream)] = value
    stream = bytes(stream)

    def decode(reads):
        dec = FrameDecoder(MAX)
        return [(type(x).__name__, *((x.flags, x.code, x.opaque, x.body) if type(x) is Frame else
                                     (x.reason, x.opaque, x.fatal))) for r in reads for x in dec.feed(r)]

    reads, start = [], 0
    for cut in sorted(cuts) + [len(stream)]:
        if start < cut <= len(stream):
            reads.append(stream[start:cut])
            start = cut
    assert decode(reads) == decode([stream[i:i + 1] for i in range(len(stream))])
