"""`txbroker job list|show|commit|abort`: coordinated transactions, for operators."""

from __future__ import annotations

import json
import time

import msgspec

from txbroker.cli.security_opts import add_arguments, admin_client, client_options

STATES = ("A job is OPEN while members join it (the broker aborts it at its deadline unless decided), PREPARED "
          "once its coordinator fixed the member list and has yet to decide (aborted at its own, longer prepared "
          "bound: 24 h unless the coordinator chose one), then COMMITTED (the members kept become visible, the "
          "others roll back) or ABORTED (every member rolls back). A job spanning broker groups is decided at its "
          "home group; its entry on each other group names that home and ends as it decided.")


def register(sub, default_admin: str) -> None:
    p = sub.add_parser("job", help="inspect and decide coordinated transactions (jobs)",
                       description="Inspect coordinated transactions (jobs: a Spark job, a micro-batch, any "
                                   "coordinator's unit of work) and decide one by hand. The broker ends every member "
                                   "from the decision; the first decision wins, so a commit after an abort (or the "
                                   "deadline's abort) is refused, and the reverse. " + STATES)
    jsub = p.add_subparsers(dest="job_command", required=True, metavar="ACTION")
    ls = jsub.add_parser("list", help="list jobs, newest first",
                         description="List jobs, newest first: state, members (prepared or kept) and members still "
                                     "pending, age, BOUND IN (the time left before the broker aborts it undecided: an "
                                     "OPEN job's deadline, a PREPARED job's prepared bound), HOME/GROUPS (an entry "
                                     "on a member group: 'home G', the group that decides it; a job at its home: the "
                                     "other groups it spans) and who decided it. " + STATES)
    ls.add_argument("--state", choices=["open", "prepared", "committed", "aborted", "undecided", "all"],
                    default="all", help="only jobs in this state: open (members still joining), prepared (member "
                                        "list fixed, awaiting the decision), committed, aborted, undecided (open or "
                                        "prepared), all (default %(default)s)")
    ls.add_argument("--group", help="only this producer group")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default %(default)s)")
    ls.set_defaults(run=list_jobs)
    sh = jsub.add_parser("show", help="show one job, with its member transaction ids",
                         description="Show one job as JSON: its state, deadline_ms (OPEN) or prepared_deadline_ms "
                                     "(PREPARED: when the broker aborts it undecided), its decision (by, decided_ms), "
                                     "home (an entry on a member group: the group that decides it) or groups and "
                                     "unresolved_groups (at its home), member_ids on this group and, at the home, "
                                     "remote_member_ids per other group. " + STATES)
    which = sh.add_mutually_exclusive_group(required=True)
    which.add_argument("job_id", nargs="?", help="the job's id (from job list, or what the coordinator's open "
                                                 "returned)")
    which.add_argument("--name", help="the newest job of this name (the name its coordinator opened it with): "
                                      "asked at --admin's broker, or with --broker on every group of its cluster")
    sh.add_argument("--broker", help="with --name: any broker of the cluster (HOST:PORT, e.g. <txbroker>-master:10911); "
                                     "the job is looked up on every group (its home has its name), as its producer "
                                     "--group sees it")
    sh.add_argument("--group", help="with --broker: the job's producer group (Spark's producerGroup)")
    sh.set_defaults(run=show)
    cmds = [ls, sh]
    for name, helptext, fn in (
            ("commit", "commit a job: its prepared members (an OPEN job: every member stored so far; an OPEN job "
                       "spanning groups is refused: only its coordinator knows the members to keep on each group) "
                       "become visible, the others are rolled back", decide),
            ("abort", "abort a job: every member is rolled back", decide)):
        c = jsub.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:] + ". By its id at "
                            "--admin's broker (the job's home: a job spanning groups is decided there), or by "
                            "--name with --broker and --group wherever its home is.")
        which = c.add_mutually_exclusive_group(required=True)
        which.add_argument("job_id", nargs="?", help="the job's id (from job list, or what the coordinator's open "
                                                     "returned)")
        which.add_argument("--name", help="with --broker: the newest job of this name, decided at its home")
        c.add_argument("--broker", help="with --name: any broker of the cluster (HOST:PORT, e.g. "
                                        "<txbroker>-master:10911), as for job show")
        c.add_argument("--group", help="with --broker: the job's producer group (Spark's producerGroup)")
        c.set_defaults(run=fn, action=name)
        cmds.append(c)
    for c in cmds:
        c.add_argument("--admin", default=default_admin, help="broker admin URL (default %(default)s)")
        add_arguments(c)


def _age(ms: int, now: float) -> str:
    return duration((now - ms) / 1000) if ms else "-"


def duration(seconds: float) -> str:
    """A span for a column: 42s, 12m30s, 23h59m (negative: already passed, '-' prefixed)."""
    sign, s = ("-" if seconds < 0 else ""), int(round(abs(seconds)))
    if s < 100:
        return f"{sign}{s}s"
    if s < 6000:
        return f"{sign}{s // 60}m{s % 60:02d}s"
    return f"{sign}{s // 3600}h{s // 60 % 60:02d}m"


def bound_ms(j) -> int:
    """When the broker aborts the job undecided: an OPEN job's deadline, a PREPARED one's prepared bound
    (0: decided, or an entry on a member group, which its home decides)."""
    if j.home:
        return 0
    return {"OPEN": j.deadline_ms, "PREPARED": j.prepared_deadline_ms}.get(j.state, 0)


def where(j) -> str:
    """HOME/GROUPS: an entry on a member group names its home; a job at its home, the groups it spans."""
    if j.home:
        return f"home {j.home}"
    return ",".join(j.groups) or "-"


def list_jobs(args) -> int:
    r = admin_client(args).jobs(args.state, args.group, args.limit)
    now = time.time() * 1000
    print(f"{'JOB':40} {'GROUP':20} {'STATE':9} {'MEMBERS':>7} {'PENDING':>7} {'AGE':>7} {'BOUND IN':>8} "
          f"{'HOME/GROUPS':16} BY")
    for j in r.jobs:
        bound = bound_ms(j)
        left = duration((bound - now) / 1000) if bound else "-"
        print(f"{j.job_id:40} {j.producer_group:20} {j.state:9} {j.members:>7} {j.pending:>7} "
              f"{_age(j.open_ms, now):>7} {left:>8} {where(j):16} {j.by or '-'}")
    print(f"{r.total} jobs")
    return 0


def show(args) -> int:
    if args.broker:
        return show_in_cluster(args)
    client = admin_client(args)
    job = client.job_named(args.name) if args.name else client.job(args.job_id)
    print(json.dumps(msgspec.to_builtins(job), indent=2))
    return 0


def show_in_cluster(args) -> int:
    """--name with --broker: the job of that name wherever its home is (the data plane, as its
    producer group; no member ids: those are the admin plane's)."""
    from txbroker.client import ClusterJobCoordinator

    if not args.name or not args.group:
        raise SystemExit("txbroker job show: --broker needs --name and --group (the job's producer group)")
    with ClusterJobCoordinator(args.group, args.broker, **client_options(args)) as c:
        job = _named(c, args, "show")
    print(json.dumps({**msgspec.structs.asdict(job.info), "at": job.home}, indent=2))
    return 0


def decide(args) -> int:
    if args.broker or args.name:
        r = decide_in_cluster(args)
    else:
        r = admin_client(args).decide_job(args.job_id, args.action)
    print(f"job {r.job_id}: {r.state} ({r.members} members kept, {r.pending} being ended)"
          + (" (already)" if r.already else ""))
    return 0


def _named(c, args, verb: str):
    """The newest job of --name on the cluster of --broker, as its producer --group sees it."""
    job = c.find(args.name)
    if job is None:
        raise SystemExit(f"txbroker job {verb}: no job named {args.name!r} of producer group {args.group!r} on any "
                         f"group of the cluster {args.broker} belongs to (never opened, or expired)")
    return job


def decide_in_cluster(args):
    """--name with --broker: commit (its prepared members) or abort the job of that name at its home,
    which tells every other group it spans (each also asks by itself)."""
    from txbroker.client import BrokerError, ClusterJobCoordinator

    if not (args.name and args.broker and args.group):
        raise SystemExit(f"txbroker job {args.action}: --name, --broker and --group go together (a job by its "
                         "name, on the cluster of --broker, of producer group --group)")
    with ClusterJobCoordinator(args.group, args.broker, **client_options(args)) as c:
        job = _named(c, args, args.action)
        try:
            return c.commit(job) if args.action == "commit" else c.abort(job)
        except BrokerError as e:
            raise SystemExit(f"txbroker job {args.action}: job {job.job_id} ({args.name!r}, home {job.home}): "
                             f"{e.code_name}: {e.remark}") from None
