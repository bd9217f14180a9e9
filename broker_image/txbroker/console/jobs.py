"""HTML of the Jobs pages (coordinated transactions): what a job's fields, decision and members say,
built from the admin API's answers (protocol/admin.py Job, JobDetail) with pages.py's helpers; no
broker is asked here (app.py does that), so every piece is a pure function of the answer and the time.

A job spanning broker groups is decided at its home group: there it names the other `groups` (and,
once prepared, the members kept on each: `remote_member_ids`); its entry on each other group names
its `home` and ends as the home decided, so the console offers actions at the home only. `at` is the
broker group whose master a page reads ("" for the console's default master)."""

from __future__ import annotations

from txbroker.console.pages import Html, join, link, ms_time, seg, table, tag, url

JOB_STATES = ("all", "open", "prepared", "committed", "aborted", "undecided")
UNDECIDED = ("OPEN", "PREPARED")
JOB_ACTIONS = {"commit": ("Commit", "go"), "abort": ("Abort", "danger")}
_BY = {"client": "its coordinator", "admin": "an operator", "deadline": "the broker at its deadline",
       "home": "its home group"}


def span(seconds: float) -> str:
    """A duration for people: 42 s, 12 min 30 s, 5 h 3 min, 2 d 4 h."""
    s = int(round(abs(seconds)))
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 2 * 86400:
        return f"{s // 3600} h {s // 60 % 60} min"
    return f"{s // 86400} d {s // 3600 % 24} h"


def time_left(ms: int, now_ms: float) -> str:
    return f"in {span((ms - now_ms) / 1000)}" if ms >= now_ms else f"passed {span((now_ms - ms) / 1000)} ago"


def job_href(job_id: str, at: str = "", action: str = "", **query) -> str:
    return url(f"/jobs/{seg(job_id)}" + (f"/{action}" if action else ""), at=at, **query)


def state_tag(state: str) -> Html:
    return tag("span", state, class_=f"state-{state}")


def can_decide(j) -> bool:
    """Actions belong to an undecided job at its home (or a job of one group), never to an entry."""
    return not j.home and j.state in UNDECIDED


def bound_of(j) -> tuple[str, int]:
    """When the broker aborts it undecided: an OPEN job's deadline, a PREPARED job's own (longer) bound;
    ("", 0) for a decided job and for an entry on a member group (its home decides)."""
    if j.home or j.state not in UNDECIDED:
        return "", 0
    if j.state == "PREPARED":
        return "prepared bound", j.prepared_deadline_ms
    return "deadline", j.deadline_ms


def bound(j, now_ms: float) -> str:
    label, ms = bound_of(j)
    return f"{label} {ms_time(ms)} ({time_left(ms, now_ms)})" if label else ""


def where(j) -> Html:
    """An entry on a member group: its home, linked (decided there); a job at its home: the groups it spans."""
    if j.home:
        return join(["home ", link(job_href(j.job_id, j.home), j.home), " (decided there)"])
    if j.groups:
        return join(["spans "] + [join([", " if i else "", link(job_href(j.job_id, g), g)])
                                  for i, g in enumerate(j.groups)])
    return Html("")


def decided_by(j) -> str:
    if j.state in UNDECIDED or not j.by:
        return ""
    return f"{j.by}, {ms_time(j.decided_ms)}" if j.decided_ms else j.by


def action_links(j, at: str) -> Html:
    return join(join([link(job_href(j.job_id, at, a), label + "…"), " "]) for a, (label, _cls) in JOB_ACTIONS.items())


def job_row(j, now_ms: float, at: str, can_write: bool) -> list:
    return [link(job_href(j.job_id, at), j.job_id), j.name, j.producer_group, state_tag(j.state), j.members, j.pending,
            where(j), bound(j, now_ms), decided_by(j), action_links(j, at) if can_write and can_decide(j) else ""]


JOB_COLUMNS = ["Job", "Name", "Producer group", "State", "Members", "Pending", "Home / groups",
               "Deadline or prepared bound", "Decided by", ""]


def jobs_table(jobs, now_ms: float, at: str, can_write: bool) -> Html:
    return table(JOB_COLUMNS, [job_row(j, now_ms, at, can_write) for j in jobs], "jobs")


def remote_count(j) -> int:
    return sum(len(ids) for ids in getattr(j, "remote_member_ids", {}).values())


def job_fields(j, now_ms: float, group: str) -> Html:
    rows = [["job id", j.job_id], ["name", j.name], ["producer group", j.producer_group], ["state", state_tag(j.state)],
            ["opened", ms_time(j.open_ms)]]
    label, ms = bound_of(j)
    if label:
        rows.append([label, f"{ms_time(ms)} ({time_left(ms, now_ms)})"])
    if j.state == "OPEN":
        count = f"{j.pending} joined so far here (fixed when it is prepared)"
    else:
        count = (f"{j.members} {'prepared' if j.state == 'PREPARED' else 'kept'} here"
                 + (f", {remote_count(j)} on other groups" if remote_count(j) else ""))
    rows += [["members", count], ["pending", f"{j.pending} members not yet ended here"]]
    if j.state not in UNDECIDED:
        rows += [["decided", ms_time(j.decided_ms)], ["decided by", j.by], ["resolved", "yes" if j.resolved else "no"]]
    if j.home:
        rows.append(["home group", where(j)])
    elif j.groups:
        rows.append(["groups spanned", where(j)])
        if j.unresolved_groups and j.state not in UNDECIDED:
            rows.append(["groups not yet resolved", ", ".join(j.unresolved_groups)])
    if group:
        rows.append(["read from broker group", group])
    return table(["Field", "Value"], rows, "job")


def decision(j, now_ms: float) -> Html:
    """One paragraph: where the job's decision stands, and what happens next."""
    if j.home:
        text = [f"Decided by its home group {j.home}: this is the job's entry on a group holding members; they end "
                f"as {j.home} decided (this group's master asks it). ", link(job_href(j.job_id, j.home),
                                                                             "See the job at its home: decided there")]
        if j.state not in UNDECIDED:
            text.insert(1, f"{j.home} decided: {j.state}" + (", every member here has ended. " if j.resolved else
                                                             f", {j.pending} members here still being ended. "))
        return tag("p", join(text), class_="decision")
    others = f" and {remote_count(j)} on other groups" if remote_count(j) else ""
    if j.state == "OPEN":
        text = (f"Undecided: members may still join. The broker aborts it at its {bound(j, now_ms)} unless its "
                "coordinator or an operator decides it first.")
    elif j.state == "PREPARED":
        text = (f"Prepared: its coordinator fixed its members ({j.members} here{others}) and has not decided. A commit "
                f"keeps exactly those. The broker aborts it at its {bound(j, now_ms)} unless it is decided first.")
    else:
        who = _BY.get(j.by, j.by or "?")
        if j.state == "COMMITTED":
            text = (f"Committed by {who} at {ms_time(j.decided_ms)}: {j.members} members kept here{others}, "
                    "the others rolled back.")
        else:
            text = f"Aborted by {who} at {ms_time(j.decided_ms)}: every member rolls back."
        if j.resolved:
            text += " Every member has ended" + (" on every group it spans." if j.groups else ".")
        else:
            waiting = [f"{j.pending} members here still being ended"] if j.pending else []
            if j.groups and j.unresolved_groups:
                waiting.append(f"waiting for {', '.join(j.unresolved_groups)} to end theirs")
            text += " " + ("; ".join(waiting) or "its end is not yet published") + "."
    return tag("p", text, class_="decision")


def _ids(ids, tx_at: str | None) -> Html:
    if not ids:
        return Html("")
    if tx_at is None:  # another group's transactions: its own console (or ?at=) shows them
        return join(join([", " if i else "", t]) for i, t in enumerate(ids))
    return join(join([", " if i else "", link(url(f"/transactions/{seg(t)}", at=tx_at), t)]) for i, t in enumerate(ids))


def members(j, group: str, at: str) -> Html:
    """The members per group: this group's (`member_ids`: prepared or kept, else every one stored so far)
    and, at the home, those on each other group the job was prepared or committed with."""
    here = group or "this broker"
    role = " (entry: decided at " + j.home + ")" if j.home else (" (home)" if j.groups else "")
    rows = [[here + role, len(j.member_ids), _ids(j.member_ids, at)]]
    remote = getattr(j, "remote_member_ids", {})
    for g in j.groups:
        ids = remote.get(g, [])
        if ids:
            rows.append([g, len(ids), _ids(ids, g)])
        elif j.state in UNDECIDED:
            rows.append([g, "", join([f"known to {g} until the job is prepared: ",
                                      link(job_href(j.job_id, g), f"its entry on {g}")])])
        else:
            rows.append([g, 0, "none kept" if j.state == "COMMITTED" else "every member rolls back"])
    return table(["Group", "Members", "Transactions"], rows, "members")


def consequence(j, action: str) -> tuple[str, str]:
    """What the action does, and a warning when the broker will refuse it (else "")."""
    others = f" and {remote_count(j)} on {', '.join(j.groups)}" if remote_count(j) else ""
    if action == "abort":
        spread = f", here and on {', '.join(j.groups)} (which follow this decision)" if j.groups else ""
        return f"Every member rolls back{spread}: nothing of it is ever delivered. This is final.", ""
    if j.state == "PREPARED":
        return (f"Its {j.members} prepared members here{others} become visible; every other member rolls back. "
                "This is final."), ""
    if j.groups:
        return "", (f"This job is OPEN and spans broker groups ({', '.join(j.groups)}): the broker commits it only "
                    "with the list of members to keep on every group, which only its coordinator knows, so it will "
                    "refuse a commit from here. Let its coordinator prepare or commit it, or abort it.")
    return (f"It is OPEN: every member stored so far ({len(j.member_ids)}, listed below) is kept and becomes visible; "
            "it takes no more members. This is final."), ""
