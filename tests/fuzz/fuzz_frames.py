"""Coverage-guided fuzzing (atheris) of the frame decoder and every body decoder.

Input: byte 0 is the chunk size the stream is fed in (0: all at once); the rest is the byte
stream a broker or client would receive. Each decoded frame's body also goes through every body
decoder (each must decode or raise one of BODY_ERRORS, and what decodes must round-trip).

    .venv/bin/python tests/fuzz/fuzz_frames.py tests/fuzz/corpus/frames -atheris_runs=100000

See README.md beside this file for the record of runs.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import atheris
except ImportError:  # replaying the corpus (tests/unit/test_fuzz_corpus.py) needs no atheris
    atheris = None


def _imports():
    from harness import decode_body_any, decode_stream
    from txbroker.protocol.framing import Frame
    return decode_body_any, decode_stream, Frame


if atheris is not None and __name__ == "__main__":
    with atheris.instrument_imports(include=["txbroker", "harness"]):
        decode_body_any, decode_stream, Frame = _imports()
else:
    decode_body_any, decode_stream, Frame = _imports()


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    chunk, stream = data[0], data[1:]
    out = decode_stream(stream, [chunk] * (len(stream) // chunk + 1) if chunk else [])
    for item in out:
        if type(item) is Frame:
            decode_body_any(item.body)


def main() -> None:
    # libFuzzer runs argv[0] again through the shell for -merge=1 and -fork: make that this
    # interpreter (the virtualenv's) running this file
    argv0 = f"{sys.executable} {os.path.abspath(__file__)}"
    atheris.Setup([argv0] + sys.argv[1:], TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
