"""`txbroker tx list|show|commit|rollback|resume`: handling stuck transactions by hand."""

from __future__ import annotations

import json
import time

import msgspec

from txbroker.cli.security_opts import add_arguments, admin_client


def register(sub, default_admin: str) -> None:
    p = sub.add_parser("tx", help="inspect and resolve transactions",
                       description="Inspect pending and parked transactions and decide them by hand: an operator's "
                                   "commit or rollback is final and idempotent; resume puts a parked transaction "
                                   "(checkMax reached) back under check-back.")
    tsub = p.add_subparsers(dest="tx_command", required=True, metavar="ACTION")
    ls = tsub.add_parser("list", help="list pending and parked transactions")
    ls.add_argument("--state", choices=["pending", "parked", "all"], default="all",
                    help="pending (under check-back), parked (checkMax reached) or all (default)")
    ls.add_argument("--group", help="only this producer group")
    ls.add_argument("--limit", type=int, default=100, help="at most this many, oldest first (default %(default)s)")
    ls.set_defaults(run=list_tx)
    cmds = [ls]
    for name, helptext, fn in (("show", "show one transaction", show),
                               ("commit", "commit a transaction (makes its messages visible)", act),
                               ("rollback", "roll a transaction back (its messages are never delivered)", act),
                               ("resume", "resume a parked transaction: check-back starts over", act)):
        c = tsub.add_parser(name, help=helptext)
        c.add_argument("transaction_id", help="the transaction's id (from tx list, or the producer's result)")
        if name in ("commit", "rollback"):
            c.add_argument("--force", action="store_true",
                           help="end a participant of a transaction spanning broker groups here although its home "
                                "group decides it: this tears the transaction unless the home ends it the same way")
        c.set_defaults(run=fn, action=name)
        cmds.append(c)
    for c in cmds:
        c.add_argument("--admin", default=default_admin, help="broker admin URL (default %(default)s)")
        add_arguments(c)


def list_tx(args) -> int:
    r = admin_client(args).transactions(args.state, args.group, args.limit)
    now = time.time() * 1000
    print(f"{'TRANSACTION':34} {'GROUP':20} {'STATE':9} {'MSGS':>4} {'CHECKS':>6} {'AGE':>8}")
    for t in r.transactions:
        age = f"{(now - t.born_ms) / 1000:.0f}s"
        print(f"{t.transaction_id:34} {t.producer_group:20} {t.state:9} {t.messages:>4} {t.checks:>6} {age:>8}")
    print(f"{r.total} transactions")
    return 0


def show(args) -> int:
    print(json.dumps(msgspec.to_builtins(admin_client(args).transaction(args.transaction_id)), indent=2))
    return 0


def act(args) -> int:
    r = admin_client(args).act_on_transaction(args.transaction_id, args.action, getattr(args, "force", False))
    print(f"transaction {r.transaction_id}: {r.state}" + (" (already)" if r.already else ""))
    if r.warning:
        print(f"warning: {r.warning}")
    return 0
