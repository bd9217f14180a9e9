"""The history checker: what the clients saw against what the cluster holds once every fault is
healed and every transaction decided. Jepsen's rules for a transactional queue, on our invariants:

  lost        an acknowledged commit (transaction, kept job member, plain send) not delivered (I6:
              must be 0 under SYNC replication and flush)
  duplicate   a message stored in its topic more than once (I3)
  phantom     a delivered message whose transaction was rolled back, or meant to be (I2), or that
              no client ever sent
  torn        a transaction, or the kept members of a job, partly delivered
  unresolved  a transaction still pending or parked after the settle time (I4)
  split brain two brokers acting as master at one epoch at the same time (I5)

and for the consumer group on Orders (at-least-once: a message consumed again is counted apart,
as `redelivered`, not as an anomaly):

  group lost       a message Orders holds that the group never consumed
  group phantom    a consumed message that Orders does not hold (rolled back, never committed)
  offset regressed a queue's committed offset read lower than an earlier read of it

Each anomaly names the transaction and its messages; the run's report adds the seed and the
nemesis events around it.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from chaos.workload import History


def check(h: History, delivered: Counter, pending: int, masters_by_epoch: dict[int, set[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    known = set()
    by_job: dict[str, list[str]] = defaultdict(list)
    for key, tx in h.txs.items():
        known.update(tx.bodies)
        seen = [b for b in tx.bodies if delivered.get(b)]
        if tx.job:
            by_job[tx.job].append(key)
        if seen and len(seen) != len(tx.bodies):
            out["torn"].append(f"{key}: {len(seen)} of {len(tx.bodies)} messages delivered ({', '.join(seen)})")
        if tx.acked == "COMMIT" and len(seen) < len(tx.bodies):
            out["lost"].append(f"{key} ({tx.kind}): acknowledged COMMIT, {len(tx.bodies) - len(seen)} of "
                               f"{len(tx.bodies)} messages not delivered")
        if seen and (tx.acked == "ROLLBACK" or tx.intended == "ROLLBACK"):
            out["phantom"].append(f"{key} ({tx.kind}): {'acknowledged' if tx.acked else 'decided'} ROLLBACK, "
                                  f"delivered {', '.join(seen)}")
    for body, n in delivered.items():
        if n > 1:
            out["duplicate"].append(f"{body} stored {n} times")
        if body not in known:
            out["phantom"].append(f"{body}: delivered, never sent")
    for job, members in by_job.items():
        kept = [m for m in members if h.txs[m].intended in ("COMMIT", "EITHER")]
        visible = [m for m in kept if all(delivered.get(b) for b in h.txs[m].bodies)]
        if visible and len(visible) != len(kept):
            out["torn"].append(f"job {job}: {len(visible)} of its {len(kept)} kept members delivered")
    if pending:
        out["unresolved"].append(f"{pending} transactions still pending or parked after settling")
    for epoch, names in masters_by_epoch.items():
        if len(names) > 1:
            out["split brain"].append(f"epoch {epoch}: {sorted(names)} acted as master at once")
    return dict(out)


def check_group(h: History, orders: set[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for body in sorted(orders - set(h.consumed)):
        out["group lost"].append(f"{body}: in Orders, never consumed by the group")
    for body in sorted(set(h.consumed) - orders):
        out["group phantom"].append(f"{body}: consumed, not in Orders")
    highest: dict[int, tuple[float, int, str]] = {}
    reported: set[tuple[int, int]] = set()
    for t, queue, offset, by in sorted(h.offsets):
        seen = highest.get(queue)
        if seen is not None and offset < seen[1] and (queue, seen[1]) not in reported:
            reported.add((queue, seen[1]))
            at = time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
            out["offset regressed"].append(f"queue {queue}: committed offset {offset} read from {by} at {at}, "
                                           f"{t - seen[0]:.1f} s after {seen[1]} from {seen[2]}")
        if seen is None or offset >= seen[1]:
            highest[queue] = (t, offset, by)
    return dict(out)


def group_counts(h: History) -> dict[str, int]:
    return {"consumed": len(h.consumed), "redelivered": sum(n - 1 for n in h.consumed.values() if n > 1),
            "retried on purpose": len(h.refused), "offset reads": len(h.offsets)}


def counts(h: History) -> dict[str, int]:
    c = Counter()
    for tx in h.txs.values():
        c[f"{tx.kind}s"] += 1
        c[f"{tx.kind}s acknowledged {tx.acked or 'unknown'}"] += 1
    return dict(c)
