"""`txbroker replication show|forget-slave`: a broker's replication as its admin API tells it, and
telling a master that one of its slaves is gone for good (a restarted master's probation waits for
every slave it recorded: README, "Broker behaviour worth knowing")."""

from __future__ import annotations

import json

import msgspec

from txbroker.cli.security_opts import add_arguments, admin_client


def register(sub, default_admin: str) -> None:
    p = sub.add_parser("replication", help="show a broker's replication; forget a slave gone for good",
                       description="A master replicates its log to its slaves and records each slave it fed, so "
                                   "that after a restart it takes no write until every recorded slave has shown "
                                   "it lost nothing they hold (its probation). Show where replication stands, or "
                                   "forget a slave that will not come back.")
    rsub = p.add_subparsers(dest="replication_command", required=True, metavar="ACTION")
    show = rsub.add_parser("show", help="role, epoch, slaves and their lag, recorded slaves, probation",
                           description="A master: its slaves (acknowledged offset, lag in records, in sync), the "
                                       "slaves it recorded at its epoch and, on probation, whom it waits for. A "
                                       "slave: its master, whether it is connected, how far it replicated.")
    show.add_argument("--admin", default=default_admin, help="the broker's admin URL (default %(default)s)")
    show.add_argument("--json", action="store_true", help="print the broker's answer as JSON")
    add_arguments(show)
    show.set_defaults(run=show_replication)
    forget = rsub.add_parser("forget-slave", help="tell a master a slave is gone for good",
                             description="Tell the master at --admin that its slave NAME will not come back (its "
                                         "store lost, its group scaled down): a restart's probation no longer waits "
                                         "for it, and whatever only that slave held is lost with it. Refused for a "
                                         "slave subscribed now, and by a slave.")
    forget.add_argument("name", help="the slave's broker name, as `replication show` lists it")
    forget.add_argument("--admin", default=default_admin, help="the master's admin URL (default %(default)s)")
    add_arguments(forget)
    forget.set_defaults(run=forget_slave)


def _print(info) -> None:
    r = info.replication
    print(f"{info.broker_name}: {info.role} at epoch {info.epoch}, log end {info.log_end_offset}, "
          f"published {info.durable_offset}")
    if info.role != "master":
        state = "connected" if r.connected else "not connected"
        print(f"master {r.master or info.master or '(none)'}: {state}, replicated to {r.replicated_offset}")
        if r.last_error:
            print(f"last error: {r.last_error}")
        return
    print(f"replication {r.mode or '-'}, {r.sync_replicas} in-sync slave(s) required for a SYNC write")
    if r.slaves:
        print(f"{'SLAVE':16} {'ADDRESS':24} {'ACKNOWLEDGED':>12} {'LAG':>8} IN SYNC")
        for s in r.slaves:
            print(f"{s.name:16} {s.address:24} {s.acknowledged_offset:>12} {s.lag:>8} {'yes' if s.in_sync else 'no'}")
    else:
        print("no slave subscribed")
    print(f"recorded slaves: {', '.join(r.recorded_slaves) or 'none'}")
    if r.sync_set is not None:   # under a controller: only these count for a SYNC write
        print(f"sync set (approved by the controller): {', '.join(r.sync_set) or 'none'}")
    if info.probation:
        print(f"on probation: {info.probation}")


def show_replication(args) -> int:
    info = admin_client(args).broker_info()
    if args.json:
        print(json.dumps(msgspec.to_builtins(info), indent=2))
        return 0
    _print(info)
    return 0


def forget_slave(args) -> int:
    info = admin_client(args).forget_slave(args.name)
    print(f"{info.broker_name} forgot slave {args.name}")
    _print(info)
    return 0
