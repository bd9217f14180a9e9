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

Each anomaly names the transaction and its messages; the run's report adds the seed and the
nemesis events around it.
"""

from __future__ import annotations

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


def counts(h: History) -> dict[str, int]:
    c = Counter()
    for tx in h.txs.values():
        c[f"{tx.kind}s"] += 1
        c[f"{tx.kind}s acknowledged {tx.acked or 'unknown'}"] += 1
    return dict(c)
