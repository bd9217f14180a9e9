"""`txbroker msg show|find` and `txbroker dlq list|resend`: finding messages, handling dead letters."""

from __future__ import annotations

import asyncio
import json

from txbroker.cli.security_opts import add_arguments, client_options
from txbroker.client.consumer import AsyncPullConsumer
from txbroker.client.dead_letters import resend_message
from txbroker.client.producer import AsyncProducer
from txbroker.protocol.bodies import MessageExt
from txbroker.protocol.names import dlq_topic


def register(sub, default_broker: str) -> None:
    m = sub.add_parser("msg", help="look messages up by id or key",
                       description="Look a stored message up by its id, or a topic's messages by key.")
    msub = m.add_subparsers(dest="msg_command", required=True, metavar="ACTION")
    show = msub.add_parser("show", help="show one message by id")
    show.add_argument("msg_id", help="message id, as send or tail prints it")
    show.set_defaults(run=show_message)
    find = msub.add_parser("find", help="messages of a topic with a key")
    find.add_argument("--topic", required=True, help="topic to search")
    find.add_argument("--key", required=True, help="one message key (messages carry space-separated keys)")
    find.add_argument("--limit", type=int, default=32, help="at most this many messages (default %(default)s)")
    find.set_defaults(run=find_messages)

    d = sub.add_parser("dlq", help="read and re-send dead letters",
                       description="Messages a consumer group failed max_reconsume_times times land in "
                                   "%DLQ%<group>. List them, and re-send one to its original topic.")
    dsub = d.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    ls = dsub.add_parser("list", help="list a group's dead letters")
    ls.add_argument("--group", required=True, help="consumer group")
    ls.set_defaults(run=list_dlq)
    rs = dsub.add_parser("resend", help="re-send a dead letter to its original topic")
    rs.add_argument("--group", required=True, help="consumer group")
    rs.add_argument("msg_id", help="the dead letter's message id (from dlq list)")
    rs.set_defaults(run=resend_dlq)
    for p in (show, find, ls, rs):
        p.add_argument("--broker", default=default_broker, help="broker data-plane address (default %(default)s)")
        add_arguments(p)


def _doc(m: MessageExt) -> dict:
    return {"msg_id": m.msg_id, "topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
            "tags": m.tags, "keys": m.keys, "properties": m.properties, "born_timestamp": m.born_timestamp,
            "transaction_id": m.transaction_id, "body": m.body.decode("utf-8", "replace")}


async def _with_consumer(args, fn):
    async with AsyncPullConsumer(args.broker, **client_options(args)) as c:
        return await fn(c)


def show_message(args) -> int:
    m = asyncio.run(_with_consumer(args, lambda c: c.view(args.msg_id)))
    print(json.dumps(_doc(m), indent=2))
    return 0


def find_messages(args) -> int:
    msgs = asyncio.run(_with_consumer(args, lambda c: c.find_by_key(args.topic, args.key, args.limit)))
    for m in msgs:
        print(json.dumps(_doc(m)))
    print(f"{len(msgs)} messages with key {args.key!r} in {args.topic}")
    return 0


def list_dlq(args) -> int:
    msgs = asyncio.run(_with_consumer(args, lambda c: c.read_all(dlq_topic(args.group))))
    print(f"{'MSG ID':22} {'ORIGINAL TOPIC':24} {'TRIES':>5}  BODY")
    for m in msgs:
        p = m.properties
        print(f"{m.msg_id:22} {p.get('RETRY_TOPIC', '?'):24} {p.get('RECONSUME_TIME', '?'):>5}  "
              f"{m.body[:60].decode('utf-8', 'replace')}")
    print(f"{len(msgs)} dead letters")
    return 0


def resend_dlq(args) -> int:
    async def go():
        async with AsyncPullConsumer(args.broker, **client_options(args)) as c:
            resend = resend_message(await c.view(args.msg_id), args.group)
        async with AsyncProducer("txbroker-dlq", args.broker, **client_options(args)) as p:
            r = await p.send(resend)
        return resend.topic, r

    topic, r = asyncio.run(go())
    print(f"re-sent {args.msg_id} to {topic} as {r.msg_id} (queue {r.queue_ids[0]}, offset {r.queue_offsets[0]})")
    return 0
