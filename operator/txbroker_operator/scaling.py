"""Pure decisions about a TxBroker's broker groups: which groups are in play and in what state, and
when a group that spec.groups no longer counts may be removed.

A group's life:
- `active`: counted by spec.groups (g0 .. g<groups-1>); the route lists it active, producers write
  to it.
- `draining`: past spec.groups (lowered), still holding brokers. The route lists it draining: its
  master refuses new messages, producers send to the other groups, consumers finish what it holds.
  It stays whole - brokers, failover, data - until its master says it is drained (nothing
  undelivered, no pending transaction) while it runs a route that drains it; then it is removed.
  Raising spec.groups again before that makes it active again, data and all.
- `removing`: decided (drained, or forced by the txbroker.dev/force-scale-down annotation): its
  pods are deleted, then its PersistentVolumeClaims, then it leaves the route and the
  status. Nothing takes it back from here: a group raised again meanwhile is created afresh once
  the old one is gone.

The operator never deletes a group's data while its master reports anything undelivered, nor while
another group's master reports participants waiting on it (transactions spanning groups whose
decision lives on it: once it is gone nobody can tell them how they ended), nor while it cannot
ask, unless forced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from . import constants as c
from . import manifests

ACTIVE = "active"
DRAINING = "draining"
REMOVING = "removing"


def wanted_groups(spec: Mapping[str, Any]) -> int:
    return max(1, min(int(spec.get("groups") or 1), c.MAX_GROUPS))


def plan(wanted: int, blocks: Mapping[str, Mapping[str, Any]], pod_groups: Iterable[int]) -> dict[int, str]:
    """Every group in play (group index -> state): those spec.groups counts, and any other one that
    still has pods or a status block. `blocks` are status.groups by name."""
    known = {manifests.group_index(n) for n in blocks} | set(pod_groups)
    out: dict[int, str] = {}
    for g in sorted(known | set(range(wanted))):
        if g < 0:
            continue
        before = (blocks.get(manifests.group_name(g)) or {}).get("state")
        if before == REMOVING:
            out[g] = REMOVING                          # decided: finish it, whatever the spec says now
        else:
            out[g] = ACTIVE if g < wanted else DRAINING
    return out


def forced(annotations: Mapping[str, str] | None) -> bool:
    return str((annotations or {}).get(c.ANNOTATION_FORCE_SCALE_DOWN, "")).strip().lower() == "true"


@dataclass(frozen=True)
class DrainReport:
    """What a draining group's master says (GET /api/v1/drain), and the route version it runs."""
    undelivered: int
    pending_transactions: int
    drained: bool
    route_version: int
    topics: Mapping[str, int] = field(default_factory=dict)
    undecided_jobs: int = 0  # jobs whose home is the group, not decided yet (other groups follow its decision)
    unreleased_jobs: int = 0  # decided there, not yet followed by every group they span
    unreleased_decisions: int = 0  # spanning transactions decided there, some participant not yet ended


@dataclass(frozen=True)
class Remove:
    forced: bool
    message: str


@dataclass(frozen=True)
class Wait:
    reason: str      # the ScaleDownBlocked condition's reason
    message: str


def _topics(topics: Mapping[str, int], limit: int = 5) -> str:
    busiest = sorted(((t, n) for t, n in topics.items() if n), key=lambda x: (-x[1], x[0]))
    shown = ", ".join(f"{t}: {n}" for t, n in busiest[:limit])
    more = f", and {len(busiest) - limit} more topic(s)" if len(busiest) > limit else ""
    return f" ({shown}{more})" if shown else ""


NONE_WAITING: Mapping[str, int] = MappingProxyType({})


def _waiting(waiting: Mapping[str, int]) -> str:
    return ", ".join(f"{n} on {g}" for g, n in sorted(waiting.items()) if n)


def decide_removal(group: str, report: DrainReport | None, unknown_why: str, drain_version: int,
                   force: bool, waiting: Mapping[str, int] | None = NONE_WAITING, waiting_why: str = "") -> Remove | Wait:
    """Whether draining `group` may go now. `report` is None when its master could not be asked
    (`unknown_why` says why); `drain_version` is the first route version that drains it: a master
    running an older route may still be taking messages, so its 'nothing undelivered' means nothing yet.
    `waiting`: per other group, its participants whose home is `group` (their masters' drain
    `waiting_on`); None when some master could not be asked (`waiting_why`)."""
    hint = f"; set the annotation {c.ANNOTATION_FORCE_SCALE_DOWN}: \"true\" to remove it anyway (what it holds is lost)"
    if force:
        if report is None:
            held = f"its master could not be asked what it holds ({unknown_why})"
        else:
            held = (f"{report.undelivered} undelivered message(s){_topics(report.topics)} and "
                    f"{report.pending_transactions} pending transaction(s)")
        if waiting and _waiting(waiting):
            held += f"; transactions waiting on its decision: {_waiting(waiting)}"
        return Remove(True, f"{group} removed by {c.ANNOTATION_FORCE_SCALE_DOWN} before it drained: {held}; "
                            "whatever it held is lost")
    if report is None:
        return Wait("DrainUnknown", f"{group} is draining and its master cannot be asked what it holds "
                                    f"({unknown_why}); its brokers and data are kept{hint}")
    if report.route_version < drain_version:
        return Wait("RouteNotLoaded", f"{group} is draining from route version {drain_version}, and its master still "
                                      f"runs version {report.route_version}; waiting for it to load the new route")
    if report.undelivered > 0:
        return Wait("UndeliveredMessages", f"{group} is draining and holds {report.undelivered} undelivered "
                                           f"message(s){_topics(report.topics)}: its consumers must finish them "
                                           f"first{hint}")
    if report.pending_transactions > 0 or report.undecided_jobs > 0 or not report.drained:
        jobs = f" and {report.undecided_jobs} undecided job(s)" if report.undecided_jobs else ""
        if report.unreleased_jobs:
            jobs += f" and {report.unreleased_jobs} decided job(s) other groups have not followed yet"
        if report.unreleased_decisions:
            jobs += (f" and {report.unreleased_decisions} decided spanning transaction(s) whose participants "
                     f"have not all ended yet")
        return Wait("PendingTransactions", f"{group} is draining and holds {report.pending_transactions} pending "
                                           f"transaction(s){jobs}: they must end first (check-back decides a "
                                           f"pending one; a parked one waits for an operator: `txbroker tx list "
                                           f"--state parked`, then commit or rollback){hint}")
    if waiting is None:
        return Wait("DrainUnknown", f"{group} is drained, but whether transactions on other groups still wait on "
                                    f"its decision cannot be asked ({waiting_why}); it is kept{hint}")
    if _waiting(waiting):
        return Wait("ParticipantsWaiting", f"{group} is drained, but transactions spanning groups still wait on its "
                                           f"decision ({_waiting(waiting)}): they must ask it first{hint}")
    return Remove(False, f"{group} is drained (nothing undelivered, no pending transaction at route version "
                         f"{report.route_version}): removing its brokers and volumes")
