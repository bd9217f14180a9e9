"""The write side shared by the broker's and the client's connections (protocol/batched.py): the
frames of one loop iteration reach the transport in one write, a closing transport takes nothing,
drained() follows pause/resume_writing, and a full batch says so once it has left."""

from __future__ import annotations

import asyncio

from txbroker.protocol.batched import OUTPUT_HIGH_WATER, BatchedProtocol


class RecordingTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, list[bytes]]] = []
        self.closing = False

    def write(self, data) -> None:
        self.calls.append(("write", [bytes(data)]))

    def writelines(self, lines) -> None:
        self.calls.append(("writelines", [bytes(x) for x in lines]))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


class Recorder(BatchedProtocol):
    def __init__(self):
        super().__init__()
        self.flushed_full = 0

    def _batch_flushed(self) -> None:
        self.flushed_full += 1


def run(test):
    async def go():
        p, t = Recorder(), RecordingTransport()
        p.connection_made(t)
        await test(p, t)
    asyncio.run(go())


def test_the_writes_of_one_loop_iteration_reach_the_transport_as_one_write():
    async def test(p, t):
        for frame in (b"a", b"bb", b"ccc"):
            p._write(frame)
        assert t.calls == []  # nothing leaves before the iteration ends
        await asyncio.sleep(0)
        assert t.calls == [("writelines", [b"a", b"bb", b"ccc"])]
        p._write(b"d")  # the next iteration: a batch of its own, a single frame as a plain write
        await asyncio.sleep(0)
        assert t.calls[1:] == [("write", [b"d"])]
        await asyncio.sleep(0)
        assert len(t.calls) == 2 and p.flushed_full == 0
    run(test)


def test_a_flush_before_closing_sends_the_batch_and_a_closing_transport_takes_no_more():
    async def test(p, t):
        p._write(b"answer")
        p._flush_out()  # as before a close: what was written first leaves now
        assert t.calls == [("write", [b"answer"])]
        t.close()
        p._write(b"late")
        await asyncio.sleep(0)
        assert t.calls == [("write", [b"answer"])]
    run(test)


def test_drained_waits_while_writing_is_paused_and_wakes_on_resume_or_loss():
    async def test(p, t):
        await asyncio.wait_for(p.drained(), 1)  # not paused: returns at once
        p.pause_writing()
        assert p._writing_paused
        waiter = asyncio.ensure_future(p.drained())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        p.resume_writing()
        await asyncio.wait_for(waiter, 1)
        assert not p._writing_paused
        p.pause_writing()
        waiter = asyncio.ensure_future(p.drained())
        await asyncio.sleep(0)
        p.connection_lost(None)  # nothing to wait for once the connection is gone
        await asyncio.wait_for(waiter, 1)
    run(test)


def test_a_batch_past_the_high_water_mark_reports_when_it_has_left():
    async def test(p, t):
        big = b"x" * (OUTPUT_HIGH_WATER // 2)
        p._write(big)
        p._write(big)
        assert p._out_bytes >= OUTPUT_HIGH_WATER  # what a producer (the broker's dispatch) checks
        await asyncio.sleep(0)
        assert p.flushed_full == 1 and p._out_bytes == 0
        assert [kind for kind, _ in t.calls] == ["writelines"]
    run(test)


def test_a_writer_that_flushes_itself_hands_its_frames_over_at_once_in_one_write():
    async def test(p, t):
        assert p._write(b"a", flush=False) is True  # the first frame: the writer must flush
        assert p._write(b"bb", flush=False) is False
        assert t.calls == []
        p.flush_now()
        assert t.calls == [("writelines", [b"a", b"bb"])]
        p.flush_now()  # nothing queued: nothing written
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(t.calls) == 1
    run(test)


def test_a_frame_queued_behind_a_scheduled_flush_leaves_with_that_flush():
    async def test(p, t):
        p._write(b"a")  # schedules the end-of-iteration flush
        assert p._write(b"b", flush=False) is False  # already on its way: the writer need not flush
        await asyncio.sleep(0)
        assert t.calls == [("writelines", [b"a", b"b"])]
    run(test)
