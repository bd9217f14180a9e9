"""The web console's pieces that need no broker: escaping, HTTP Basic parsing, CSRF tokens, and the
operator's Events (tests/integration/test_console_browser.py drives the whole of it in a browser)."""

from __future__ import annotations

import pytest

from txbroker.console.events import OperatorEvents, operator_events
from txbroker.console.pages import Html, join, link, page, post_form, table, tag
from txbroker.console.security import Gate, Visitor, basic_credentials
from txbroker.client.security import Credentials

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
