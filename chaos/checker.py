"""The history checker: what the clients saw against what the cluster served, once every fault is
healed and every transaction decided. Jepsen's rules for a transactional queue, on our invariants
(DESIGN.md I1-I6), over every broker group:

  lost             an acknowledged commit (transaction, kept job member, plain or ordered send) the
                   reader never found (I6: must be 0 under SYNC replication and flush)
  duplicate        a message stored more than once (two positions) (I3)
  phantom          a message read whose transaction was rolled back or meant to be (I2), a job member
                   never committed among them, or a message no client ever sent
  torn             a transaction (on one group or spanning several) or the kept members of a job
                   (across groups) partly read
  unresolved       a transaction still pending, or parked, after the settle time (I4)
  split brain      two brokers of one group acting as master at one epoch at the same time (I5)
  decision changed a job its home answered COMMITTED and ABORTED at different times, or answered
                   otherwise than the coordinator was acknowledged
  rewritten        a position of a queue read with two different messages (reader.py)
  key lost         a committed message still stored that a read by its key does not find (reader.py)
  key phantom      a read by a message's unique key that finds another message (reader.py)
  properties lost  a job member's message read without its job's id, the property sent once for
                   the member's messages (SEND_MESSAGE_SHARED) and stored once in its half record
  went back        a queue's end below an offset already read from it (reader.py)
  read stuck       a queue a reader starting at its first message cannot read past an offset below
                   its end (reader.py)
  unverified       (not an anomaly) an acknowledged commit not read, where retention deleted offsets
                   the reader had not read yet (a master whose clock ran ahead deletes early): the
                   report counts them, so the checks' blind spot is a number

and for the consumer groups (at-least-once: a message consumed again is counted apart, as
`redelivered`, not as an anomaly):

  group lost        a message Orders holds that chaos-cg never consumed (poison aside)
  group phantom     a consumed message Orders does not hold
  dead letter       poison Orders holds that is not in %DLQ%chaos-cg, or a dead letter not poison
  offset regressed  a queue's committed offset read lower than an earlier read of it (per group)
  order broken      a key's messages first delivered to chaos-ord out of their send order, both
                    stored in the same queue of the same group (a route change moves a key to
                    another queue, as adding partitions does in Kafka: a reordering across the
                    move is counted apart, as `reordered where the key moved`; one whose send went
                    unanswered, so its queue is unknown, as `reordered after a route change` when
                    the route changed)
  ordered lost      an acknowledged ordered send chaos-ord never consumed

(A message retention deleted before a consumer group got to it - its consumer skipped past, as
Kafka's do past log.retention - is counted as `skipped by retention`, not as an anomaly, if it was
sent at least the retention before the consumer was seen skipping it; else:
  deleted young     retention deleted it before it was as old as the retention)

and for backups (chaos/backup.py: taken from a slave with the real CLI under faults, restored at the
end into a standalone broker, its clock set back so it shows what the backup held), per restored
copy of group G taken at time T (the request sent; acknowledged after it: may or may not be there):

  backup failed       a backup neither taken nor refused with the broker's reason (nor its slave
                      unreachable), or a failed one that left a backup.json (whole or absent)
  restored lost       acknowledged COMMIT before T, read on G (above where retention had deleted
                      to in the copy), not in the copy: a transaction or send on one group; a
                      spanning transaction's part or a job member there neither visible nor pending
                      (undecided in the copy is allowed: counted as `undecided`)
  restored duplicate  a message at two positions of the copy
  restored phantom    a message in the copy no client sent, whose transaction was rolled back (or
                      meant to be), or a member of a job its home answered ABORTED
  restored torn       a transaction's messages on G partly in the copy
  restored moved      a message in the copy at another position than G served it at
  restored decision   a job decided in the copy otherwise than its home answered or the coordinator
                      was acknowledged
  restored unreadable the restore refused a whole backup, or its broker did not serve it

Each anomaly names the transaction and its messages; the run's report adds the seed and the
nemesis events around it.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from chaos.reader import JOB_PROPERTY, Reader
from chaos.workload import ORDERED, SINK_GROUP, SINKS, TOPICS, History, Tx

# A backup's slave is in sync when it heard its master within 3 heartbeats (chaos/broker.py: 200 ms)
# and holds all the master had published then (docs/backup.md): a commit acknowledged that long
# before the backup was asked for is in it; one acknowledged since may or may not be.
BACKUP_FRESH_S = 1.0
# A workload request is answered within its 5 s timeout of being written: a commit acknowledged
# less than retention minus this before a backup may still have been written before retention's
# horizon there.
WRITE_TO_ACK_S = 5.0

DATA_TOPICS = (*TOPICS, "Plain", ORDERED)
DLQ = "%DLQ%chaos-cg"


def delivered(reader: Reader) -> Counter:
    """body -> the positions it was read at, over the data topics of every group."""
    out: Counter = Counter()
    for topic in DATA_TOPICS:
        for body, positions in reader.bodies(topic).items():
            out[body] += len(positions)
    return out


def check(h: History, reader: Reader, unresolved: dict[str, int], masters_by_epoch: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    seen = delivered(reader)
    known = set()
    by_job: dict[str, list[str]] = defaultdict(list)
    for key, tx in h.txs.items():
        known.update(tx.bodies)
        got = [b for b in tx.bodies if seen.get(b)]
        if tx.job:
            by_job[tx.job].append(key)
        where = f" on {'+'.join(tx.groups)}" if tx.groups else ""
        missing = [t for b, t in zip(tx.bodies, tx.topics) if not seen.get(b)]
        blind = [(g, t) for g in tx.groups or reader.queues_groups() for t in missing if reader.skipped.get((g, t))]
        if missing and blind and (got or tx.acked == "COMMIT"):
            # retention deleted offsets there before the reader got to them: cannot tell
            out["unverified"].append(f"{key} ({tx.kind}{where}): {len(got)} of {len(tx.bodies)} read; retention "
                                     f"deleted unread offsets of {', '.join(f'{g} {t}' for g, t in blind)}")
        elif got and len(got) != len(tx.bodies):
            out["torn"].append(f"{key}{where}: {len(got)} of {len(tx.bodies)} messages read ({', '.join(got)})")
        elif tx.acked == "COMMIT" and len(got) < len(tx.bodies):
            out["lost"].append(f"{key} ({tx.kind}{where}): acknowledged COMMIT, {len(tx.bodies) - len(got)} of "
                               f"{len(tx.bodies)} messages never read")
        if tx.kind == "member":
            wrong = [(b, j) for b in got for j in sorted(reader.member_jobs.get(b, {None}), key=str) if j != tx.job]
            if wrong:
                out["properties lost"].append(f"{key} (member of job {tx.job}{where}): read with "
                                              + ", ".join(f"{b} {JOB_PROPERTY}={j!r}" for b, j in wrong))
        if got and (tx.acked == "ROLLBACK" or tx.intended == "ROLLBACK"):
            out["phantom"].append(f"{key} ({tx.kind}{where}): {'acknowledged' if tx.acked else 'decided'} ROLLBACK, "
                                  f"read {', '.join(got)}")
    for body, n in seen.items():
        if n > 1:
            out["duplicate"].append(f"{body} stored {n} times")
        if body not in known:
            out["phantom"].append(f"{body}: read, never sent")
    for job, members in by_job.items():
        kept = [m for m in members if h.txs[m].intended in ("COMMIT", "EITHER")]
        visible = [m for m in kept if all(seen.get(b) for b in h.txs[m].bodies)]
        unread = [m for m in kept if m not in visible]
        if visible and unread and all(reader.skipped.get((g, "Orders")) for m in unread for g in h.txs[m].groups):
            out["unverified"].append(f"job {job}: {len(visible)} of {len(kept)} kept members read; retention deleted "
                                     "unread offsets where the others are")
        elif visible and len(visible) != len(kept):
            groups = sorted({g for m in kept for g in h.txs[m].groups})
            out["torn"].append(f"job {job} (members on {'+'.join(groups)}): {len(visible)} of its {len(kept)} kept "
                               "members read")
    for group, n in sorted(unresolved.items()):
        if n:
            out["unresolved"].append(f"{group}: {n} transactions or jobs still pending, parked or undecided (or "
                                     "its log not all published) after settling" if n > 0 else
                                     f"{group}: no master answered at the end of settling")
    for epoch, names in masters_by_epoch.items():
        if len(names) > 1:
            out["split brain"].append(f"epoch {epoch}: {sorted(names)} acted as master at once")
    out.update(_decisions(h))
    if reader.rewritten:
        out["rewritten"] = list(reader.rewritten)
    if reader.went_back:
        out["went back"] = list(reader.went_back)
    if reader.stuck:
        out["read stuck"] = list(reader.stuck)
    if reader.key_lost:
        out["key lost"] = list(reader.key_lost)
    if reader.key_phantom:
        out["key phantom"] = list(reader.key_phantom)
    return {k: v for k, v in out.items() if v}


def _decisions(h: History) -> dict[str, list[str]]:
    acked = {}
    for key, tx in h.txs.items():
        if tx.job and tx.acked:
            acked.setdefault(tx.job, set()).add(tx.acked)
    states: dict[str, set] = defaultdict(set)
    for _t, job, state in h.decisions:
        if state in ("COMMITTED", "ABORTED"):
            states[job].add(state)
    out = []
    for job, seen in sorted(states.items()):
        if len(seen) > 1:
            out.append(f"job {job}: its home answered {' and '.join(sorted(seen))}")
        elif "COMMIT" in acked.get(job, ()) and seen == {"ABORTED"}:
            out.append(f"job {job}: the coordinator was acknowledged COMMIT; its home later answered ABORTED")
        elif acked.get(job) == {"ROLLBACK"} and seen == {"COMMITTED"}:
            out.append(f"job {job}: the coordinator was acknowledged its abort; its home later answered COMMITTED")
    return {"decision changed": out} if out else {}


def _skipped_by(h: History, cg: str, reader: Reader, topic: str) -> dict[str, float | None]:
    """The bodies of `topic` that consumer group `cg` skipped (retention deleted them first), each
    with when the skip was first seen (monotonic; None: not recorded): it was deleted by then."""
    out = {}
    for body, positions in reader.bodies(topic).items():
        for g, q, o in positions:
            for r in h.skipped:
                c, sg, t, sq, a, b = r
                if c == cg and sg == g and t == topic and sq == q and a <= o < b:
                    seen = h.skipped_seen.get(r)
                    had = out.get(body)
                    out[body] = seen if had is None or (seen is not None and seen < had) else had
    return out


# Deleted young: a skipped message sent less than this short of the retention before its skip was
# seen (the consumers' memory, read every 0.1 s). Retention ages a record by the mark taken after it
# on the boot clock (store/boot_clock.py), which the harness's clock skews leave true, so its age at
# deletion is at least the retention; the margin covers only the ms rounding of the marks.
YOUNG_MARGIN_S = 0.5


def _deleted_young(h: History, skipped: dict[str, float | None], retention_s: float) -> list[str]:
    if not retention_s:
        return []
    sent = {b: tx.created_at for tx in h.txs.values() for b in tx.bodies}
    out = []
    for body, seen in sorted(skipped.items()):
        if seen is None or body not in sent:
            continue
        age = seen - sent[body]
        if age < retention_s - YOUNG_MARGIN_S:
            out.append(f"{body}: deleted by retention {age:.1f}s or less after it was sent (retention {retention_s:g}s)")
    return out


def check_groups(h: History, reader: Reader, route_changed: bool, retention_s: float = 0.0) -> dict[str, list[str]]:
    """`retention_s`: the brokers' retention (0: not known); a message skipped younger than that is
    an anomaly, "deleted young"."""
    out: dict[str, list[str]] = defaultdict(list)
    orders = set(reader.bodies("Orders"))
    dead = set(reader.bodies(DLQ))
    skipped = _skipped_by(h, "chaos-cg", reader, "Orders") if h.skipped else {}
    out["deleted young"].extend(_deleted_young(h, skipped, retention_s))
    for body in sorted(skipped):
        out["skipped by retention"].append(f"{body}: in Orders, deleted by retention before chaos-cg got to it")
    for body in sorted(orders - set(h.consumed) - h.poison - set(skipped)):
        out["group lost"].append(f"{body}: in Orders, never consumed by chaos-cg")
    for body in sorted(set(h.consumed) - orders):
        out["group phantom"].append(f"{body}: consumed, not in Orders")
    for body in sorted((orders & h.poison) - dead - set(skipped)):
        out["dead letter"].append(f"{body}: poison in Orders, not in {DLQ}")
    for body in sorted(dead - h.poison):
        out["dead letter"].append(f"{body}: in {DLQ}, never refused for good")
    out.update(_offsets(h))
    ordered_acked = {k for k, tx in h.txs.items() if tx.kind == "ordered" and tx.acked == "COMMIT"}
    consumed_ordered = {f"ord-{key}-{n}" for key, seqs in h.ordered_deliveries.items() for n in seqs}
    skipped_ordered = _skipped_by(h, "chaos-ord", reader, ORDERED) if h.skipped else {}
    out["deleted young"].extend(_deleted_young(h, skipped_ordered, retention_s))
    for body in sorted(skipped_ordered):
        out["skipped by retention"].append(f"{body}: deleted by retention before chaos-ord got to it")
    for name, topic in SINKS:  # the other topics' consumer groups: their skips judged by age too
        cg = f"{SINK_GROUP}-{name}"
        out["deleted young"].extend(_deleted_young(h, _skipped_by(h, cg, reader, topic) if h.skipped else {},
                                                   retention_s))
    for body in sorted(ordered_acked - consumed_ordered - set(skipped_ordered)):
        out["ordered lost"].append(f"{body}: acknowledged, never consumed by chaos-ord")
    for key, seqs in sorted(h.ordered_deliveries.items()):
        first, had = [], set()
        for n in seqs:
            if n not in had:
                had.add(n)
                first.append(n)
        # every earlier-sent message delivered after a later one, not only neighbours: a key that
        # moved and came back (a group added, then drained) interleaves two queues' runs
        broken: dict[str, list[str]] = defaultdict(list)
        for i, b in enumerate(first):
            for a in first[:i]:
                if b < a:
                    broken[_reordering(h, key, a, b, route_changed)].append(f"{a} before {b}")
        for kind, pairs in broken.items():
            out[kind].append(f"key {key}: first delivered {', '.join(pairs[:5])}{' ...' if len(pairs) > 5 else ''}"
                             f" ({len(pairs)} pairs)")
    return {k: v for k, v in out.items() if v}


def _reordering(h: History, key: str, later: int, earlier: int, route_changed: bool) -> str:
    """What a delivery of `later` before `earlier` (both of `key`) is: order broken within one queue,
    or a reordering across a move of the key from one queue to another."""
    where = [_placement(h.txs.get(f"ord-{key}-{n}")) for n in (later, earlier)]
    if None in where:
        return "reordered after a route change" if route_changed else "order broken"
    return "order broken" if where[0] == where[1] else "reordered where the key moved"


def _placement(tx: Tx | None) -> tuple[str, int] | None:
    return (tx.groups[0], tx.queue_ids[0]) if tx and tx.groups and tx.queue_ids else None


def _offsets(h: History) -> dict[str, list[str]]:
    out = []
    highest: dict[tuple, tuple[float, int, str]] = {}
    reported: set[tuple] = set()
    for t, group, cg, queue, offset, by in sorted(h.offsets):
        key = (group, cg, queue)
        seen = highest.get(key)
        if seen is not None and offset < seen[1] and (key, seen[1]) not in reported:
            reported.add((key, seen[1]))
            at = time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
            out.append(f"{group} {cg} queue {queue}: committed offset {offset} read from {by} at {at}, "
                       f"{t - seen[0]:.1f} s after {seen[1]} from {seen[2]}")
        if seen is None or offset >= seen[1]:
            highest[key] = (t, offset, by)
    return {"offset regressed": out} if out else {}


def group_counts(h: History, reader: Reader) -> dict[str, int]:
    return {"consumed": len(h.consumed), "redelivered": sum(n - 1 for n in h.consumed.values() if n > 1),
            "retried on purpose": len(h.refused), "dead letters": len(reader.bodies(DLQ)),
            "ordered consumed": sum(len(set(v)) for v in h.ordered_deliveries.values()),
            "ordered redelivered": sum(len(v) - len(set(v)) for v in h.ordered_deliveries.values()),
            "offset reads": len(h.offsets), "job decisions read": len(h.decisions),
            "positions read": len(reader.seen), "offsets skipped (retention before the reader)": sum(reader.skipped.values())}


def counts(h: History) -> dict[str, int]:
    c = Counter()
    for tx in h.txs.values():
        c[f"{tx.kind}s"] += 1
        c[f"{tx.kind}s acknowledged {tx.acked or 'unknown'}"] += 1
        if len(set(tx.groups)) > 1:
            c[f"{tx.kind}s spanning groups"] += 1
    return dict(c)


REFUSAL_REASONS = ("not connected", "nothing heard", "holds the log to LSN", "is the master of its group",
                   "no master to follow", "no room for the checkpoint", "store is damaged")


def check_backups(backups: list[dict]) -> dict[str, list[str]]:
    """Each backup's outcome: taken, refused naming why, or its slave unreachable; nothing else."""
    out = []
    for b in backups:
        what = f"backup of {b['group']} from {b['target']} at {b['at_s']} s"
        if b["outcome"] == "failed":
            out.append(f"{what}: failed (exit {b['exit_code']}): {b['reason']}")
        elif b["outcome"] == "refused" and not any(r in b["reason"] for r in REFUSAL_REASONS):
            out.append(f"{what}: refused without saying why: {b['reason']}")
        if b.get("left_whole"):
            out.append(f"{what}: {b['outcome']}, yet its directory holds a backup.json")
    return {"backup failed": out} if out else {}


def _job_outcomes(h: History) -> dict[str, set[str]]:
    """job id -> what the history says it ended as: COMMITTED and/or ABORTED (its home's answers,
    and the coordinator's acknowledged decision)."""
    out: dict[str, set[str]] = defaultdict(set)
    for _t, job, state in h.decisions:
        if state in ("COMMITTED", "ABORTED"):
            out[job].add(state)
    acked: dict[str, set[str]] = defaultdict(set)
    for tx in h.txs.values():
        if tx.job and tx.acked:
            acked[tx.job].add(tx.acked)
    for job, states in acked.items():
        out[job].add("COMMITTED" if "COMMIT" in states else "ABORTED")
    return out


def check_restored(h: History, reader: Reader, backup: dict, restored: dict, retention_s: float = 0.0,
                   clock_ahead_s: float = 0.0) -> tuple[dict[str, list[str]], dict]:
    """A restored copy of one group against the history (the module's doc, `restored ...`).
    `backup`: chaos/backup.take's record (`sent`, `answered`: monotonic, `manifest`); `restored`:
    chaos/backup.restore_and_read's; `retention_s`: the brokers' retention, and `clock_ahead_s` how
    far the backed-up broker's clock was ever set ahead (its retention then deletes sooner).
    Returns the anomalies and counts of what was checked.

    What retention may have deleted before the checkpoint is not checked: below a queue's start in
    the copy, and also above it, since retention keeps the records live state derives from (a
    pending transaction's, a queue's newest), so a kept record can sit below a hole it left."""
    out: dict[str, list[str]] = defaultdict(list)
    m = backup["manifest"]
    group = m["group"]
    label = f"backup {m['id']} of {group} (from {m['broker']}, epoch {m['epoch']}, LSN {m['last_lsn']})"
    counts = Counter()
    if "error" in restored:
        out["restored unreadable"].append(f"{label}: {restored['error']}")
        return dict(out), dict(counts)
    where: dict[str, list[tuple]] = defaultdict(list)
    for pos, body in restored["seen"].items():
        where[body].append(pos)
    starts, pending = restored["starts"], set(restored["pending"])
    live = {body: (t, q, o) for (g, t, q, o), body in reader.seen.items() if g == group and t in DATA_TOPICS}
    owner = {b: key for key, tx in h.txs.items() for b in tx.bodies}
    outcomes = _job_outcomes(h)
    counts["messages in the copy"] = len(restored["seen"])
    aged_before = (backup.get("answered", backup["sent"]) + clock_ahead_s - retention_s + WRITE_TO_ACK_S
                   if retention_s else 0.0)
    for body, positions in sorted(where.items()):
        if len(positions) > 1:
            out["restored duplicate"].append(f"{label}: {body} at {sorted(positions)}")
        key = owner.get(body)
        if key is None:
            out["restored phantom"].append(f"{label}: {body} at {positions[0]}, never sent")
            continue
        tx = h.txs[key]
        if tx.acked == "ROLLBACK" or tx.intended == "ROLLBACK":
            out["restored phantom"].append(f"{label}: {body} of {key} ({tx.kind}), "
                                           f"{'acknowledged' if tx.acked else 'decided'} ROLLBACK, in the copy")
        elif tx.job and outcomes.get(tx.job) == {"ABORTED"}:
            out["restored phantom"].append(f"{label}: {body}, a member of job {tx.job} its home answered ABORTED, "
                                           "in the copy")
    for key, tx in h.txs.items():
        here = [b for b in tx.bodies if b in live]  # its messages the group held, as the reader read them
        if not here:
            continue
        aged = tx.acked_at < aged_before  # (unacknowledged ones are never `must`)
        covered = [] if aged else [b for b in here if live[b][2] >= starts.get(live[b][:2], 0)]
        got = [b for b in covered if b in where]
        must = tx.acked == "COMMIT" and 0 < tx.acked_at <= backup["sent"] - BACKUP_FRESH_S
        spanning = tx.kind == "member" or len(set(tx.groups)) > 1
        if must:
            counts["acknowledged before the backup"] += 1
            if len(covered) < len(here):
                counts["unverified (retention before the backup)"] += 1
        if got and len(got) != len(covered):
            out["restored torn"].append(f"{label}: {key} ({tx.kind}): {len(got)} of its {len(covered)} messages "
                                        f"there in the copy ({', '.join(got)})")
        elif must and covered and not got:
            if spanning and key in pending:
                counts["undecided in the copy"] += 1
            else:
                out["restored lost"].append(
                    f"{label}: {key} ({tx.kind}{' spanning' if spanning else ''}), acknowledged COMMIT "
                    f"{backup['sent'] - tx.acked_at:.2f} s before the backup was asked for, not in the copy"
                    f"{' nor pending there' if spanning else ''} ({', '.join(f'{b} at {live[b]}' for b in covered)})")
        for b in got:
            if live[b] not in where[b]:
                out["restored moved"].append(f"{label}: {b} at {where[b]} in the copy, {group} served it at {live[b]}")
        counts["checked present"] += len(got)
    for job, state in sorted(restored["jobs"].items()):
        said = outcomes.get(job, set())
        if state in ("COMMITTED", "ABORTED"):
            counts["jobs decided in the copy"] += 1
            if said and state not in said:
                out["restored decision"].append(f"{label}: job {job} {state} in the copy; the history says "
                                                f"{' and '.join(sorted(said))}")
        else:
            counts["jobs undecided in the copy"] += 1
    if restored.get("rewritten"):
        out["restored moved"].extend(f"{label}: {r}" for r in restored["rewritten"])
    return {k: v for k, v in out.items() if v}, dict(counts)
