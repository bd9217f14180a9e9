"""`txbroker job list|show|commit|abort`: coordinated transactions, for operators."""

from __future__ import annotations

import json
import time

import msgspec

from txbroker.cli.security_opts import add_arguments, admin_client


def register(sub, default_admin: str) -> None:
    p = sub.add_parser("job", help="inspect and decide coordinated transactions (jobs)",
                       description="Inspect coordinated transactions (jobs: a Spark job, a micro-batch, any "
                                   "coordinator's unit of work) and decide one by hand. The broker ends every member "
                                   "from the decision; the first decision wins, so a commit after an abort (or the "
                                   "deadline's abort) is refused, and the reverse.")
    jsub = p.add_subparsers(dest="job_command", required=True, metavar="ACTION")
    ls = jsub.add_parser("list", help="list jobs, newest first")
    ls.add_argument("--state", choices=["open", "prepared", "committed", "aborted", "undecided", "all"],
                    default="all", help="only jobs in this state (default %(default)s)")
    ls.add_argument("--group", help="only this producer group")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default %(default)s)")
    ls.set_defaults(run=list_jobs)
    cmds = [ls]
    for name, helptext, fn in (
            ("show", "show one job, with its member transaction ids", show),
            ("commit", "commit a job: its prepared members (an OPEN job: every member stored so far) become "
                       "visible, the others are rolled back", decide),
            ("abort", "abort a job: every member is rolled back", decide)):
        c = jsub.add_parser(name, help=helptext)
        c.add_argument("job_id", help="the job's id (from job list, or what the coordinator's open returned)")
        c.set_defaults(run=fn, action=name)
        cmds.append(c)
    for c in cmds:
        c.add_argument("--admin", default=default_admin, help="broker admin URL (default %(default)s)")
        add_arguments(c)


def _age(ms: int, now: float) -> str:
    return f"{(now - ms) / 1000:.0f}s" if ms else "-"


def list_jobs(args) -> int:
    r = admin_client(args).jobs(args.state, args.group, args.limit)
    now = time.time() * 1000
    print(f"{'JOB':40} {'GROUP':20} {'STATE':9} {'MEMBERS':>7} {'PENDING':>7} {'AGE':>7} {'DEADLINE IN':>11} BY")
    for j in r.jobs:
        left = f"{(j.deadline_ms - now) / 1000:.0f}s" if j.state in ("OPEN", "PREPARED") else "-"
        print(f"{j.job_id:40} {j.producer_group:20} {j.state:9} {j.members:>7} {j.pending:>7} "
              f"{_age(j.open_ms, now):>7} {left:>11} {j.by or '-'}")
    print(f"{r.total} jobs")
    return 0


def show(args) -> int:
    print(json.dumps(msgspec.to_builtins(admin_client(args).job(args.job_id)), indent=2))
    return 0


def decide(args) -> int:
    r = admin_client(args).decide_job(args.job_id, args.action)
    print(f"job {r.job_id}: {r.state} ({r.members} members kept, {r.pending} being ended)"
          + (" (already)" if r.already else ""))
    return 0
