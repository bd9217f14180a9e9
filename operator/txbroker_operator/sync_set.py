"""The slaves whose acknowledgements a SYNC master counts (its sync set), approved by its controller
and kept in the status before the master counts them: Kafka's ISR kept by its controller, RocketMQ's
SyncStateSet. Without it the controller learnt who had acknowledged by sampling the master now and
then: a slave that joined and acknowledged between two looks, its master lost before the next,
was never known to hold anything, and a failover promoted one that lacked those writes.

Status, per group: `syncSet: {"epoch": E, "slaves": [...]}`, every slave the master at epoch E may
count, and always at least what it counts. So it grows in the status first and then on the master
(`keep`, `before_promotion`), and shrinks on the master first (it drops a slave once an approved one
holds all that slave had) and then in the status. Failover waits for enough of it
(failover.decide_failover). A master that counts every slave (not run under a controller, or from
before this) reports no set: none is kept for it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .observe import Member


def saved(view: Mapping[str, Any], epoch: int) -> set[str]:
    """The status' sync set for the master at `epoch` (none recorded for it: empty)."""
    s = view.get("syncSet") or {}
    return set(s.get("slaves") or ()) if s.get("epoch") == epoch else set()


def keep(view: Mapping[str, Any], head: Member, save: Callable[[dict | None], None],
         push: Callable[[int, list[str]], Any]) -> list[str]:
    """One pass: each slave subscribed to `head` and not yet counted is saved, then approved on the
    master (`push`, which answers the master's info); a slave the master stopped counting leaves
    the saved set after it has left the master's. Answers the slaves it approved (to log)."""
    info = head.info
    if info is None or not info.is_master:
        return []
    if info.sync_set is None:   # it counts every slave: a set kept for it would only mislead failover
        if view.get("syncSet"):
            save(None)
        return []
    epoch, counted = info.epoch, set(info.sync_set)
    mine = saved(view, epoch)
    want = {s["name"] for s in info.slaves} - counted
    if want:
        save({"epoch": epoch, "slaves": sorted(mine | counted | want)})
        counted = set(push(epoch, sorted(counted | want)).sync_set or ())
        mine = mine | counted | want
    if mine != counted or (view.get("syncSet") or {}).get("epoch") != epoch:
        save({"epoch": epoch, "slaves": sorted(counted)})
    return sorted(want & counted)


def before_promotion(members: Mapping[str, Member], head: Member) -> list[str]:
    """The slaves a new master counts from its promotion: every other broker that answers (each
    follows it by then), so writes need not wait for the next pass; saved before the promotion."""
    return sorted(m.name for m in members.values() if m is not head and m.info is not None and not m.deleting)
