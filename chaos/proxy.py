"""A TCP proxy that delays what it forwards: the harness's stand-in for netem, which this kernel
lacks (../shared/TESTBED.md). It runs in a broker's network namespace, in front of the broker's
client port, so every connection to the broker (clients, the controller's requests, its slaves'
replication, other groups' questions) passes it:

    python -m chaos.proxy --listen 10.251.0.10:10911 --upstream 10.251.0.10:20911 --control b0.delay

The control file holds JSON, re-read every 0.2 s: {"clients_ms": 0, "peers_ms": 300} delays, in
both directions, what flows on connections from the hub (clients, the controller) and from other
brokers (replication, participants asking their home). Each chunk is held for the delay after it
arrived, then written in order: latency without throttling, as netem's delay would add.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from chaos.net import HUB_IP

CHUNK = 65536


class Delays:
    def __init__(self, control: Path):
        self.control = control
        self.by_class = {"clients_ms": 0, "peers_ms": 0}

    def of(self, peer_ip: str) -> float:
        return self.by_class["clients_ms" if peer_ip == HUB_IP else "peers_ms"] / 1000

    async def follow(self) -> None:
        while True:
            try:
                self.by_class.update(json.loads(self.control.read_text() or "{}"))
            except (OSError, ValueError):
                pass  # absent or half written: keep the last delays
            await asyncio.sleep(0.2)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_of) -> None:
    due: asyncio.Queue = asyncio.Queue()

    async def deliver():
        while True:
            at, data = await due.get()
            if data is None:
                break
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while data := await reader.read(CHUNK):
            due.put_nowait((time.monotonic() + delay_of(), data))
        due.put_nowait((0.0, None))
        await sender
    except (ConnectionError, OSError):
        pass
    finally:
        sender.cancel()
        writer.close()


async def serve(listen: str, upstream: str, control: Path) -> None:
    delays = Delays(control)
    up_host, up_port = upstream.rsplit(":", 1)

    async def handle(client_r, client_w):
        peer_ip = client_w.get_extra_info("peername")[0]
        try:
            up_r, up_w = await asyncio.open_connection(up_host, int(up_port))
        except OSError:  # the broker is down: the connection is refused, as it would be without us
            client_w.close()
            return
        delay = lambda: delays.of(peer_ip)  # noqa: E731 - read per chunk: a change applies at once
        await asyncio.gather(_pump(client_r, up_w, delay), _pump(up_r, client_w, delay))

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port), reuse_address=True)
    async with server:
        await asyncio.gather(server.serve_forever(), delays.follow())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--control", required=True, type=Path)
    args = ap.parse_args()
    asyncio.run(serve(args.listen, args.upstream, args.control))


if __name__ == "__main__":
    main()
