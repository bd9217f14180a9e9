"""`txbroker topic create|list`."""

from __future__ import annotations

from txbroker.cli.security_opts import add_arguments, admin_client


def register(sub, default_admin: str) -> None:
    p = sub.add_parser("topic", help="create and list topics", description="Create and list topics (admin API).")
    tsub = p.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    c = tsub.add_parser("create", help="create a topic (or add queues to one)")
    c.add_argument("name", help="topic name: letters, digits, %%, |, _, - (1-127 characters)")
    c.add_argument("--queues", type=int, default=0, help="queue count (default: the broker's, 4)")
    c.set_defaults(run=create)
    ls = tsub.add_parser("list", help="list topics and their queue counts")
    ls.set_defaults(run=list_topics)
    for q in (c, ls):
        q.add_argument("--admin", default=default_admin, help="broker admin URL (default %(default)s)")
        add_arguments(q)


def create(args) -> int:
    r = admin_client(args).create_topic(args.name, args.queues)
    print(f"topic {r.name}: {r.queues} queues" + ("" if r.created else " (already existed)"))
    return 0


def list_topics(args) -> int:
    r = admin_client(args).topics()
    print(f"{'TOPIC':40} QUEUES")
    for t in r.topics:
        print(f"{t.name:40} {t.queues}")
    return 0
