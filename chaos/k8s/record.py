"""The history and the reader's record, as JSON: written by the workload pod at the end of a
schedule, read back by the runner on the node, which gives them to chaos/checker.py unchanged.

The keys of chaos/schedule.py's `_dump_history` (txs, read, skipped, decisions, offsets, jobs) keep
their meaning; the rest is what the checker reads beyond them (acknowledged commits and failures in
time, what the consumer groups took, what the reader found rewritten, gone back or stuck, the job
property each member was read with, each group's queue counts). Every field of the reader that the
checker reads goes through here: one left out reads as empty on the runner, and its check passes
unseen (tests/unit/test_chaos_k8s_record.py). Times: `commits` and `failures` are the pod's
monotonic clock, `mono_to_wall` turns them into wall time (the runner's events are on its own
monotonic clock; both are on one machine's wall clock).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from chaos.reader import Reader
from chaos.workload import History, Tx


def dump(h: History, reader: Reader) -> dict:
    with h.lock, reader.lock:
        return {"txs": {k: vars(tx) for k, tx in h.txs.items()},
                "read": [[*pos, body] for pos, body in reader.seen.items()],
                "skipped": [[*k, n] for k, n in reader.skipped.items()],
                "decisions": list(h.decisions), "offsets": list(h.offsets), "jobs": dict(h.jobs),
                "commits": list(h.commits), "failures": list(h.failures),
                "consumed": dict(h.consumed), "refused": dict(h.refused), "poison": sorted(h.poison),
                "ordered_deliveries": {k: list(v) for k, v in h.ordered_deliveries.items()},
                "skipped_ranges": [list(s) for s in h.skipped],
                "rewritten": list(reader.rewritten), "went_back": list(reader.went_back),
                "stuck": list(reader.stuck),
                "member_jobs": {b: sorted(jobs, key=str) for b, jobs in reader.member_jobs.items()},
                "queues": [[g, t, n] for (g, t), n in reader.queues.items()],
                "mono_to_wall": time.time() - time.monotonic()}


def load(d: dict) -> tuple[History, Reader]:
    h = History()
    h.txs = {k: Tx(**v) for k, v in d["txs"].items()}
    h.commits, h.failures = list(d["commits"]), list(d["failures"])
    h.consumed, h.refused = Counter(d["consumed"]), Counter(d["refused"])
    h.poison = set(d["poison"])
    h.ordered_deliveries = defaultdict(list, {k: list(v) for k, v in d["ordered_deliveries"].items()})
    h.offsets = [tuple(o) for o in d["offsets"]]
    h.decisions = [tuple(x) for x in d["decisions"]]
    h.skipped = {tuple(s) for s in d["skipped_ranges"]}
    h.jobs = dict(d["jobs"])
    reader = Reader(lambda: {})
    reader.seen = {(g, t, q, o): body for g, t, q, o, body in d["read"]}
    for g, t, n in d["skipped"]:
        reader.skipped[(g, t)] = n
    reader.queues = {(g, t): n for g, t, n in d["queues"]}
    reader.rewritten, reader.went_back = list(d["rewritten"]), list(d["went_back"])
    reader.stuck = list(d["stuck"])
    for body, jobs in d["member_jobs"].items():
        reader.member_jobs[body] = set(jobs)   # None (JSON null): read without its job's property
    return h, reader
