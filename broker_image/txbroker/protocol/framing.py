"""Length-prefixed frames.

Layout of one frame (big-endian):

    u32 length      bytes that follow this field (header rest + body)
    u8  version     FRAME_VERSION
    u8  flags       bit 0: response, bit 1: one-way (no response expected)
    u16 code        request code, or response code when the response flag is set
    u32 opaque      request id chosen by the sender; a response carries its request's id
    ... body        msgpack (see bodies.py)

The decoder never raises out of `feed`: a frame that cannot be framed becomes a FrameError value,
so the connection can answer it and decide whether the stream is still usable. After a fatal
error the stream cannot be resynchronised, and the decoder stays dead: later bytes are dropped,
never decoded as frames (found by the property tests, tests/unit/test_fuzz_protocol.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

FRAME_VERSION = 1
FLAG_RESPONSE = 0x01
FLAG_ONEWAY = 0x02

_HEADER = struct.Struct(">IBBHI")
HEADER_SIZE = _HEADER.size  # 12
_REST = HEADER_SIZE - 4  # header bytes counted by `length`


@dataclass(slots=True)
class Frame:
    flags: int
    code: int
    opaque: int
    body: bytes

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flags & FLAG_ONEWAY)


@dataclass(slots=True)
class FrameError:
    """A frame that could not be taken in. `fatal` means the byte stream cannot be resynchronised."""

    reason: str
    opaque: int = 0
    fatal: bool = True


def encode_frame(flags: int, code: int, opaque: int, body: bytes) -> bytes:
    return _HEADER.pack(_REST + len(body), FRAME_VERSION, flags, code, opaque) + body


class FrameDecoder:
    """Incremental decoder: feed bytes, get frames (or errors) out."""

    __slots__ = ("_buf", "_max_frame", "_skip", "_skip_opaque", "dead")

    def __init__(self, max_frame_size: int) -> None:
        self._buf = bytearray()
        self._max_frame = max_frame_size
        self._skip = 0  # bytes of an oversize frame still to discard
        self._skip_opaque = 0
        self.dead = False  # a fatal error was returned: nothing more is decoded

    def feed(self, data: bytes) -> list[Frame | FrameError]:
        if self.dead:
            return []
        if not self._buf and not self._skip and type(data) is bytes:
            whole = self._whole_frames(data)  # the usual read: whole frames, nothing carried over
            if whole is not None:
                return whole
        buf = self._buf
        buf += data
        out: list[Frame | FrameError] = []
        pos = 0
        end = len(buf)
        if self._skip:
            n = min(self._skip, end)
            self._skip -= n
            pos = n
            if self._skip == 0:
                out.append(FrameError(
                    f"frame exceeds the maximum frame size of {self._max_frame} bytes",
                    self._skip_opaque, fatal=False))
        while not self._skip and end - pos >= HEADER_SIZE:
            length, version, flags, code, opaque = _HEADER.unpack_from(buf, pos)
            if version != FRAME_VERSION:
                out.append(FrameError(f"unsupported frame version {version} (expected {FRAME_VERSION})", opaque))
                pos = end  # the stream is not ours: drop it all
                break
            if length < _REST:
                out.append(FrameError(f"frame length {length} is shorter than the header", opaque))
                pos = end
                break
            total = 4 + length
            if total > self._max_frame:
                if length > 16 * self._max_frame:
                    # Too far out to be an honest oversize message: treat the stream as garbage.
                    out.append(FrameError(f"frame length {length} is implausible", opaque))
                    pos = end
                    break
                # Discard the oversize frame's bytes as they come, then answer it: the
                # connection stays usable and nothing else on it is lost.
                available = end - pos
                if available >= total:
                    pos += total
                    out.append(FrameError(
                        f"frame exceeds the maximum frame size of {self._max_frame} bytes", opaque, fatal=False))
                    continue
                self._skip = total - available
                self._skip_opaque = opaque
                pos = end
                break
            if end - pos < total:
                break
            out.append(Frame(flags, code, opaque, bytes(buf[pos + HEADER_SIZE:pos + total])))
            pos += total
        if pos:
            del buf[:pos]
        if out and type(out[-1]) is FrameError and out[-1].fatal:
            self.dead = True
            buf.clear()
        return out

    def _whole_frames(self, data: bytes) -> list[Frame] | None:
        """`data` cut into frames without copying it into the buffer first, if it is exactly whole,
        well-formed frames within the size limit; None sends it the general way (feed)."""
        out = []
        pos, end, limit = 0, len(data), self._max_frame
        unpack = _HEADER.unpack_from
        while end - pos >= HEADER_SIZE:
            length, version, flags, code, opaque = unpack(data, pos)
            total = 4 + length
            if version != FRAME_VERSION or length < _REST or total > limit or end - pos < total:
                return None
            out.append(Frame(flags, code, opaque, data[pos + HEADER_SIZE:pos + total]))
            pos += total
        return out if pos == end else None

    @property
    def buffered(self) -> int:
        return len(self._buf)
