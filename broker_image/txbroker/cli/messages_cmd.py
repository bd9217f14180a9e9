"""`txbroker send` and `txbroker tail`."""

from __future__ import annotations

import asyncio
import sys
import time

from txbroker.cli.security_opts import add_arguments, client_options
from txbroker.client.consumer import AsyncPullConsumer
from txbroker.client.producer import AsyncProducer
from txbroker.protocol.bodies import Message


def register(sub, default_broker: str) -> None:
    s = sub.add_parser("send", help="send messages", description="Send one message per BODY argument (or one per "
                                                                  "line of standard input with -).")
    s.add_argument("--broker", default=default_broker, help="broker data-plane address (default %(default)s)")
    s.add_argument("--topic", required=True, help="topic to send to (created if the broker auto-creates topics)")
    s.add_argument("--tags", default="", help="the messages' tag, for consumers' tag filters")
    s.add_argument("--keys", default="", help="space-separated message keys")
    s.add_argument("--group", default="txbroker-cli", help="producer group (default %(default)s)")
    s.add_argument("bodies", nargs="+", metavar="BODY", help="message body (text); - reads one per line from stdin")
    add_arguments(s)
    s.set_defaults(run=send)

    t = sub.add_parser("tail", help="read committed messages of a topic",
                       description="Print committed messages of a topic, from the start (default) or the end, "
                                   "and with --follow keep waiting for new ones.")
    t.add_argument("--broker", default=default_broker, help="broker data-plane address (default %(default)s)")
    t.add_argument("--topic", required=True, help="topic to read")
    t.add_argument("--queue", type=int, help="only this queue")
    t.add_argument("--from-end", action="store_true", help="start at the end of each queue")
    t.add_argument("--follow", "-f", action="store_true", help="keep waiting for new messages (Ctrl-C stops)")
    t.add_argument("--limit", type=int, default=0, help="stop after this many messages")
    add_arguments(t)
    t.set_defaults(run=tail)


def send(args) -> int:
    bodies = [line.rstrip("\n") for line in sys.stdin] if args.bodies == ["-"] else args.bodies
    msgs = [Message(args.topic, b.encode(), tags=args.tags, keys=args.keys) for b in bodies]

    async def go():
        async with AsyncProducer(args.group, args.broker, **client_options(args)) as p:
            return await p.send(msgs)

    r = asyncio.run(go())
    for mid, q, off in zip(r.msg_ids, r.queue_ids, r.queue_offsets):
        print(f"SEND_OK {mid} queue={q} offset={off}")
    return 0


def tail(args) -> int:
    async def go() -> int:
        async with AsyncPullConsumer(args.broker, **client_options(args)) as c:
            count = await c.queue_count(args.topic)
            queues = [args.queue] if args.queue is not None else list(range(count))
            offsets = {}
            for q in queues:
                offsets[q] = (await c.pull(args.topic, q, 0, 1)).max_offset if args.from_end else 0
            printed = 0
            while True:
                got_any = False
                for q in queues:
                    r = await c.pull(args.topic, q, offsets[q], 256, wait_ms=0)
                    for m in r.messages:
                        stamp = time.strftime("%H:%M:%S", time.localtime(m.born_timestamp / 1000))
                        tx = f" tx={m.transaction_id}" if m.transaction_id else ""
                        print(f"{stamp} {m.topic}:{m.queue_id}@{m.queue_offset} {m.msg_id} tags={m.tags or '-'}"
                              f"{tx} {m.body.decode('utf-8', 'replace')}", flush=True)
                        printed += 1
                        if args.limit and printed >= args.limit:
                            return 0
                    offsets[q] = r.next_offset
                    got_any |= bool(r.messages)
                if not got_any:
                    if not args.follow:
                        return 0
                    await c.pull(args.topic, queues[0], offsets[queues[0]], 1, wait_ms=1000)

    return asyncio.run(go())
