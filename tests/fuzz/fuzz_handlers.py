"""Coverage-guided fuzzing (atheris) of the request handlers of a real in-process broker
(RocksDB in a temporary directory, authentication on), through a BrokerConnection on a fake
transport (harness.py).

Input format (easy to write seeds for; tests/fuzz/make_corpus.py writes them):
    byte 0      bit 0: the connection is authenticated (as an admin: every handler reachable);
                bits 1-7: chunk size the frames are delivered in (0: all at once)
    records     u16 request code, u8 flags, u16 body length, body  (big-endian; the last may be cut)
Long polls in structured pull bodies are cut to 50 ms. A failure is an exception out of the
connection, a malformed answer, or a SYSTEM_ERROR answer (a handler raised what it did not expect).

    .venv/bin/python tests/fuzz/fuzz_handlers.py tests/fuzz/corpus/handlers -atheris_runs=20000
"""

from __future__ import annotations

import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import atheris
except ImportError:  # replaying the corpus needs no atheris
    atheris = None


def _imports():
    from harness import InProcessBroker, cut_long_polls
    from txbroker.protocol.framing import encode_frame
    return InProcessBroker, cut_long_polls, encode_frame


if atheris is not None and __name__ == "__main__":
    with atheris.instrument_imports(include=["txbroker", "harness"]):
        InProcessBroker, cut_long_polls, encode_frame = _imports()
else:
    InProcessBroker, cut_long_polls, encode_frame = _imports()

_RECORD = struct.Struct(">HBH")
_broker = None


def broker():
    global _broker
    if _broker is None:
        _broker = InProcessBroker(auth=True)
    return _broker


def close() -> None:
    """Stop the broker the inputs ran against (the corpus test's teardown)."""
    global _broker
    if _broker is not None:
        _broker.close()
        _broker = None


def parse(data: bytes) -> tuple[bool, int, list[bytes]]:
    """(authenticated, chunk size, frames) from an input."""
    if not data:
        return False, 0, []
    authenticated, chunk = bool(data[0] & 1), data[0] >> 1
    frames, pos, opaque = [], 1, 1
    while pos + _RECORD.size <= len(data) and len(frames) < 16:
        code, flags, length = _RECORD.unpack_from(data, pos)
        pos += _RECORD.size
        body = cut_long_polls(code, data[pos:pos + length])
        pos += length
        frames.append(encode_frame(flags & 0x03, code, opaque, body))
        opaque += 1
    return authenticated, chunk, frames


def TestOneInput(data: bytes) -> None:
    authenticated, chunk, frames = parse(data)
    if not frames:
        return
    stream = b"".join(frames)
    chunks = [stream[i:i + chunk] for i in range(0, len(stream), chunk)] if chunk else [stream]
    b = broker()
    b.feed(chunks, authenticated)
    assert b.still_serves(), "the broker stopped answering a good request"


def main() -> None:
    # libFuzzer runs argv[0] again through the shell for -merge=1 and -fork: make that this
    # interpreter (the virtualenv's) running this file
    argv0 = f"{sys.executable} {os.path.abspath(__file__)}"
    atheris.Setup([argv0] + sys.argv[1:], TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
