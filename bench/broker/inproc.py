"""The broker's own cost per single-message transaction, without sockets or clients.

    .venv/bin/python bench/broker/inproc.py [--connections 8] [--seconds 5] [--profile out.prof]

A real Broker (RocksDB in a temporary directory, ASYNC flush) runs in this process; N connections
on in-memory transports each send a half message (1 KiB, a random transaction id as the client
makes) and, once it is answered, its COMMIT, round after round. CPU per transaction is the
process's CPU time over the measured rounds divided by the transactions: the interpreter's and
RocksDB's share of a request, which the socket benchmarks (network.py) mix with the kernel's,
with wake-ups and with the clients' share of the same two cores. Figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid

from txbroker.broker.config import load_config
from txbroker.broker.connection import BrokerConnection
from txbroker.broker.server import Broker
from txbroker.protocol.bodies import CreateTopicRequest, EndTransactionRequest, Message, SendRequest, encode
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.protocol.framing import FrameDecoder, encode_frame

COMMIT = 1


class MemoryTransport(asyncio.Transport):
    """Keeps what the broker writes; the bench reads it back as frames."""

    def __init__(self):
        super().__init__()
        self.out = bytearray()

    def write(self, data) -> None:
        self.out += data

    def writelines(self, lines) -> None:
        for line in lines:
            self.out += line

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 9)}.get(name, default)


class Client:
    """One producer's connection: one request at a time, as loadgen.py's producers."""

    def __init__(self, broker: Broker):
        self.conn = BrokerConnection(broker)
        self.t = MemoryTransport()
        self.conn.connection_made(self.t)
        self.dec = FrameDecoder(64 << 20)
        self.opaque = 0

    def send(self, code: int, body) -> None:
        self.opaque += 1
        self.conn.data_received(encode_frame(0, code, self.opaque, encode(body)))

    def answer(self):
        if not self.t.out:
            return None
        frames = self.dec.feed(bytes(self.t.out))
        self.t.out.clear()
        (f,) = frames
        if f.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"answer {f.code}: {f.body[:200]!r}")
        return f


async def run(connections: int, seconds: float, warmup: float, rounds: int = 0) -> dict:
    data = tempfile.mkdtemp(prefix="txbroker-inproc-")
    try:
        config = load_config(None, {"data_dir": data + "/data", "listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
                                    "flush_disk_type": "ASYNC", "log_level": "WARNING"})
        broker = Broker(config)
        await broker.start()
        try:
            clients = [Client(broker) for _ in range(connections)]
            clients[0].send(RequestCode.UPDATE_AND_CREATE_TOPIC, CreateTopicRequest("Bench", 8))
            await asyncio.sleep(0.05)
            clients[0].answer()
            body = os.urandom(1024)
            done = 0
            t_end = time.monotonic() + warmup + seconds
            measuring_from = time.monotonic() + warmup
            cpu0 = wall0 = None
            measured = rounds * len(clients)
            while True:
                now = time.monotonic()
                if cpu0 is None and now >= measuring_from:
                    cpu0, wall0, done = time.process_time(), now, 0
                if cpu0 is not None and (done >= measured if rounds else now >= t_end):
                    break
                txids = [uuid.uuid4().hex for _ in clients]
                for c, txid in zip(clients, txids):
                    c.send(RequestCode.SEND_MESSAGE, SendRequest("bench", [Message("Bench", body)], txid))
                await _answered(clients)
                for c, txid in zip(clients, txids):
                    c.send(RequestCode.END_TRANSACTION, EndTransactionRequest("bench", txid, COMMIT))
                await _answered(clients)
                done += len(clients)
            cpu = time.process_time() - cpu0
            wall = time.monotonic() - wall0
            return {"connections": connections, "transactions": done, "seconds": round(wall, 2),
                    "tx_per_s": round(done / wall), "cpu_us_per_tx": round(cpu * 1e6 / done, 1)}
        finally:
            await broker.stop()
    finally:
        shutil.rmtree(data, ignore_errors=True)


async def _answered(clients: list[Client]) -> None:
    waiting = list(clients)
    for _ in range(1000):
        await asyncio.sleep(0)
        waiting = [c for c in waiting if c.answer() is None]
        if not waiting:
            return
    raise RuntimeError(f"{len(waiting)} requests not answered")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=0,
                    help="a fixed number of measured rounds (a transaction per connection each) instead of --seconds: "
                         "for instruction counts under valgrind --tool=callgrind, which do not vary with the host")
    ap.add_argument("--profile", default="", help="write a cProfile of the measured runs here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    prof = None
    if args.profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    for _ in range(args.repeat):
        with asyncio.Runner(loop_factory=factory) as runner:
            r = runner.run(run(args.connections, args.seconds, args.warmup, args.rounds))
        print(f"{r['connections']} connections: {r['tx_per_s']:,} tx/s, {r['cpu_us_per_tx']} us CPU per transaction "
              f"({r['transactions']:,} in {r['seconds']} s)", flush=True)
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
