"""`txbroker cluster show`: the broker groups of a cluster, as a client bootstrapping from --broker
sees them, and each broker's role and epoch (RocketMQ's `mqadmin clusterList`)."""

from __future__ import annotations

import asyncio
import json

from txbroker.cli.security_opts import add_arguments, client_options
from txbroker.client.cluster.route import RouteBook
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import ClientError


def register(sub, default_broker: str) -> None:
    c = sub.add_parser("cluster", help="show the broker groups of a cluster",
                       description="A cluster is several broker groups (a master and its slaves each); any of its "
                                   "brokers serves the route that lists them. Show it, and each broker's role.")
    csub = c.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    show = csub.add_parser("show", help="the route's groups, their brokers, roles and epochs")
    show.add_argument("--broker", default=default_broker,
                      help="any broker of the cluster, data-plane address (default %(default)s)")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_arguments(show)
    show.set_defaults(run=show_cluster)


async def _look(args) -> dict:
    options = client_options(args)
    book = RouteBook(args.broker, **options)
    try:
        route = await book.fetch()
    finally:
        await book.close()

    async def role(address: str) -> dict:
        client = BrokerClient([address], require_master=False, connect_timeout=2.0, **options)
        try:
            hb = await client.heartbeat()
            return {"address": address, "role": hb.role, "epoch": hb.epoch, "name": hb.broker_name}
        except ClientError as e:
            return {"address": address, "role": "unreachable", "epoch": 0, "error": str(e)}
        finally:
            await client.close()

    groups = []
    for g in route.groups:
        brokers = await asyncio.gather(*(role(a) for a in g.addresses))
        groups.append({"name": g.name, "state": g.state, "brokers": list(brokers)})
    return {"cluster": route.cluster, "version": route.version, "groups": groups}


def show_cluster(args) -> int:
    doc = asyncio.run(_look(args))
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"cluster {doc['cluster'] or '(none: a single group)'}, route version {doc['version']}")
    print(f"{'GROUP':10} {'STATE':9} {'BROKER':24} {'ROLE':12} EPOCH")
    for g in doc["groups"]:
        for b in g["brokers"]:
            print(f"{g['name']:10} {g['state']:9} {b['address']:24} {b['role']:12} {b['epoch']}")
    masters = {g["name"]: [b for b in g["brokers"] if b["role"] == "master"] for g in doc["groups"]}
    leaderless = [name for name, m in masters.items() if not m]
    if leaderless:
        print(f"no master answers in group(s) {', '.join(leaderless)}")
        return 1
    return 0
