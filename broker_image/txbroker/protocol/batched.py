"""The write side of a connection, shared by the broker's connections and the client's: frames
written in one loop iteration leave in one system call, and the peer's reading is tracked.

Batching: a group commit completes many requests at once, and a client pipelines many requests
in one iteration; a send system call costs more than the rest of an answer, so `_write` only
queues, and the first frame of an iteration schedules the flush at its end (call_soon).

Flow control, as in aiohttp's base_protocol: the transport calls pause_writing when its buffer
passes its high-water mark (the peer is not reading) and resume_writing when it drains;
`drained()` waits for the latter (or for the connection to end). Frames queued here, not yet
handed to the transport, are counted too: a batch past OUTPUT_HIGH_WATER tells its producer to
wait (the broker stops dispatching), and `_batch_flushed` says when it may go on.
"""

from __future__ import annotations

import asyncio

OUTPUT_HIGH_WATER = 4 * 1024 * 1024  # bytes queued in one batch before a producer should wait


class BatchedProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        # kept: asyncio.get_running_loop() per batch costs a getpid() system call on Python 3.11
        self._loop: asyncio.AbstractEventLoop | None = None
        self._out: list[bytes] | None = None  # frames to write at the end of this loop iteration
        self._out_bytes = 0
        self._writing_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._touch = None  # the loop's IdlePoll.touch (protocol/idle_poll.py), if it polls before sleeping

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._loop = asyncio.get_running_loop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()  # nothing to wait for any more

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._writable.set()

    async def drained(self) -> None:
        """Wait until the peer has taken what was written (or the connection is gone)."""
        await self._writable.wait()

    def _write(self, data: bytes, flush: bool = True) -> bool:
        """Queue a frame; it leaves with the others of this loop iteration. With `flush` False the
        caller hands the frames over itself (`flush_now`) once it has queued what goes together:
        then True says this frame started the batch, so the caller must."""
        out = self._out
        if self._touch is not None:
            self._touch()
        self._out_bytes += len(data)
        if out is None:
            self._out = [data]
            if not flush:
                return True
            self._loop.call_soon(self._flush_out)
        else:
            out.append(data)
        return False

    def flush_now(self) -> None:
        """Hand what is queued to the transport now, not at the end of the loop iteration."""
        if self._out is not None:
            self._flush_out()

    def _flush_out(self) -> None:
        """Hand the batch to the transport (also called directly before a close, so that what was
        written first still leaves). A closing transport takes nothing more."""
        out, self._out = self._out, None
        full = self._out_bytes >= OUTPUT_HIGH_WATER
        self._out_bytes = 0
        if out and not self.transport.is_closing():
            if len(out) == 1:
                self.transport.write(out[0])
            else:
                self.transport.writelines(out)
        if full:
            self._batch_flushed()

    def _batch_flushed(self) -> None:
        """A batch that had reached OUTPUT_HIGH_WATER was handed to the transport."""
