"""The web console's pieces that need no broker: escaping, HTTP Basic parsing, CSRF tokens, the
operator's Events, and what the Jobs pages say of a job (tests/integration/test_console_browser.py
drives the whole of it in a browser)."""

from __future__ import annotations

import html as htmllib
import re

import pytest

from txbroker.console.events import OperatorEvents, operator_events
from txbroker.console.jobs import (
    bound, can_decide, consequence, decided_by, decision, job_fields, job_row, jobs_table, members, span, time_left,
    where,
)
from txbroker.console.pages import Html, join, link, page, post_form, table, tag
from txbroker.console.security import Gate, Visitor, basic_credentials
from txbroker.client.security import Credentials
from txbroker.protocol.admin import JobDetail

EVIL = '<script>alert("x")</script>&'


def test_everything_a_broker_stores_is_escaped():
    html = page(EVIL, join([table(["h"], [[EVIL, link("/t/" + EVIL, EVIL)]]), tag("pre", EVIL),
                            post_form("/a?x=" + EVIL, EVIL, EVIL, fields={"v": EVIL})]), who=EVIL)
    assert "<script>" not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in html
    assert Html("<b>kept</b>") in join([Html("<b>kept</b>")])  # markup built here stays markup


@pytest.mark.parametrize("header,want", [
    ("Basic YWRtaW46YWRtaW4tc2VjcmV0", ("admin", "admin-secret")),
    ("basic YWRtaW46YTpi", ("admin", "a:b")),  # the secret may hold ':'
    ("Basic YWRtaW4=", None), ("Basic YWRtaW46", None), ("Bearer x", None), ("Basic !!", None), ("", None),
])
def test_basic_credentials(header, want):
    got = basic_credentials(header)
    assert (got and (got.access_key, got.secret_key)) == (want or None)


def test_csrf_token_is_bound_to_the_credentials():
    gate = Gate(cluster=None)
    alice = Visitor("alice", Credentials("alice", "s1"), True, True)
    token = gate.csrf_token(alice)
    assert gate.check_csrf(alice, token)
    assert not gate.check_csrf(Visitor("alice", Credentials("alice", "s2"), True, True), token)
    tampered = token[:-1] + ("1" if token[-1] == "0" else "0")  # one character changed, whatever it was
    assert not gate.check_csrf(alice, "") and not gate.check_csrf(alice, tampered)
    assert Gate(cluster=None).csrf_token(alice) != token  # a key of its own per console


def test_operator_events_only_newest_first():
    doc = {"items": [
        {"reportingComponent": "txbroker-operator", "type": "Normal", "reason": "Promoted", "message": "b-1 is master",
         "involvedObject": {"kind": "TxBroker", "name": "b"}, "lastTimestamp": "2026-01-01T00:00:02Z", "count": 2},
        {"source": {"component": "kubelet"}, "reason": "Pulled", "lastTimestamp": "2026-01-01T00:00:03Z"},
        {"source": {"component": "txbroker-operator"}, "type": "Warning", "reason": "MasterLost",
         "involvedObject": {"kind": "TxBroker", "name": "b"}, "lastTimestamp": "2026-01-01T00:00:01Z"},
    ]}
    evs = operator_events(doc)
    assert [(e.reason, e.object, e.count) for e in evs] == [("Promoted", "TxBroker/b", 2), ("MasterLost", "TxBroker/b", 1)]


def test_events_outside_a_cluster_say_so(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    ev = OperatorEvents()
    assert not ev.available and ev.why == "not in a cluster"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    (tmp_path / "token").write_text("t")
    (tmp_path / "namespace").write_text("tx\n")
    ev = OperatorEvents(account_dir=str(tmp_path))
    assert ev.available and ev.namespace == "tx" and ev.base == "https://10.0.0.1:443"


# ---- the Jobs pages' pieces (console/jobs.py): what a user reads of a job -------------------------

NOW = 1_800_000_000_000


def a_job(**fields) -> JobDetail:
    base = dict(job_id="nightly.g0.e1.5", producer_group="orders-pg", state="OPEN", open_ms=NOW - 60_000,
                deadline_ms=NOW + 600_000, name="nightly")
    return JobDetail(**{**base, **fields})


def text(html) -> str:
    """What a reader sees of some markup: tags dropped, entities decoded."""
    return htmllib.unescape(re.sub(r"<[^>]+>", "", str(html)))


@pytest.mark.parametrize("seconds,want", [(0, "0 s"), (119, "119 s"), (750, "12 min 30 s"),
                                          (86_400, "24 h 0 min"), (3 * 86_400 + 7200, "3 d 2 h")])
def test_span_reads_as_people_count(seconds, want):
    assert span(seconds) == want


def test_time_left_says_in_or_passed():
    assert time_left(NOW + 90_000, NOW) == "in 90 s"
    assert time_left(NOW - 5_000, NOW) == "passed 5 s ago"


def test_an_open_job_shows_its_deadline_and_the_prepared_one_its_own_bound():
    open_job = a_job(pending=2, member_ids=["t1", "t2"])
    assert bound(open_job, NOW).startswith("deadline ") and "(in 10 min 0 s)" in bound(open_job, NOW)
    prepared = a_job(state="PREPARED", members=2, pending=2, prepared_deadline_ms=NOW + 86_400_000)
    assert bound(prepared, NOW).startswith("prepared bound ") and "(in 24 h 0 min)" in bound(prepared, NOW)
    fields = text(job_fields(prepared, NOW, ""))
    assert "prepared bound" in fields and "deadline" not in fields
    assert "aborts it at its prepared bound" in text(decision(prepared, NOW))
    assert bound(a_job(state="COMMITTED", by="client", decided_ms=NOW), NOW) == ""


def test_a_job_row_has_actions_only_for_an_admin_and_an_undecided_job_at_its_home():
    row = job_row(a_job(), NOW, "", can_write=True)
    assert "Commit…" in text(row[-1]) and "Abort…" in text(row[-1])
    assert 'href="/jobs/nightly.g0.e1.5/commit"' in row[-1]
    assert job_row(a_job(), NOW, "", can_write=False)[-1] == ""
    assert job_row(a_job(state="COMMITTED", by="client", decided_ms=NOW), NOW, "", can_write=True)[-1] == ""
    entry = a_job(home="g0", deadline_ms=0, name="")
    assert job_row(entry, NOW, "g1", can_write=True)[-1] == "" and not can_decide(entry)


def test_an_entry_on_a_member_group_names_its_home_and_links_there():
    entry = a_job(home="g0", deadline_ms=0, name="", pending=1, member_ids=["t9"])
    assert text(where(entry)) == "home g0 (decided there)"
    assert 'href="/jobs/nightly.g0.e1.5?at=g0"' in where(entry)
    said = text(decision(entry, NOW))
    assert "Decided by its home group g0" in said and "decided there" in said
    assert 'href="/jobs/nightly.g0.e1.5?at=g0"' in decision(entry, NOW)
    assert bound(entry, NOW) == ""  # no deadline of its own
    followed = a_job(home="g0", deadline_ms=0, state="COMMITTED", by="home", decided_ms=NOW, resolved=True)
    assert "g0 decided: COMMITTED, every member here has ended" in text(decision(followed, NOW))


def test_the_home_of_a_spanning_job_lists_its_members_per_group():
    home = a_job(state="PREPARED", members=1, pending=1, groups=["g1", "g2"], prepared_deadline_ms=NOW + 3_600_000,
                 member_ids=["h1"], remote_member_ids={"g1": ["r1", "r2"]})
    assert text(where(home)) == "spans g1, g2"
    rows = text(members(home, "g0", "g0"))
    assert "g0 (home)1h1" in rows and "g12r1, r2" in rows
    assert 'href="/transactions/r1?at=g1"' in members(home, "g0", "g0")  # read from g1's master
    assert "1 prepared here, 2 on other groups" in text(job_fields(home, NOW, "g0"))
    what, refusal = consequence(home, "commit")
    assert "Its 1 prepared members here and 2 on g1, g2 become visible" in what and refusal == ""
    opened = a_job(groups=["g1"], member_ids=["h1"])
    assert "known to g1 until the job is prepared" in text(members(opened, "g0", "g0"))


def test_committing_an_open_job_spanning_groups_says_the_broker_needs_the_member_list():
    what, refusal = consequence(a_job(groups=["g1"]), "commit")
    assert what == "" and "OPEN and spans broker groups (g1)" in refusal and "will refuse" in refusal
    what, refusal = consequence(a_job(member_ids=["t1", "t2"]), "commit")
    assert "every member stored so far (2" in what and refusal == ""
    what, refusal = consequence(a_job(groups=["g1"]), "abort")
    assert "Every member rolls back, here and on g1" in what and refusal == ""


def test_a_decided_job_says_who_decided_and_what_is_left():
    aborted = a_job(state="ABORTED", by="deadline", decided_ms=NOW, pending=3)
    said = text(decision(aborted, NOW))
    assert "Aborted by the broker at its deadline" in said and "3 members here still being ended" in said
    waiting = a_job(state="COMMITTED", by="admin", decided_ms=NOW, members=2, groups=["g1"], unresolved_groups=["g1"],
                    remote_member_ids={"g1": ["r1"]})
    said = text(decision(waiting, NOW))
    assert "Committed by an operator" in said and "2 members kept here and 1 on other groups" in said
    assert "waiting for g1 to end theirs" in said
    assert decided_by(waiting).startswith("admin, ")


def test_a_job_table_escapes_what_the_broker_stores():
    html = jobs_table([a_job(name=EVIL, producer_group=EVIL)], NOW, "", True)
    assert "<script>" not in html and "&lt;script&gt;" in html
