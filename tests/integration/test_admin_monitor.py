"""The monitor permission and GET /api/v1/whoami (for the web console's read-only users): a monitor
user reads the admin API and is refused every write; whoami tells any authenticated user what it
may do; without authentication the broker says everyone may do all."""

from __future__ import annotations

import pytest

from support.credentials import write_credentials
from txbroker.client import Credentials
from txbroker.client.admin import AdminClient, AdminError

USERS = {
    "admin": {"admin": True},
    "watcher": {"monitor": True},
    "app": {"topics": ["Orders=PUB"]},
}


def admin(b, key: str | None) -> AdminClient:
    return AdminClient(b.admin_url, credentials=Credentials(key, f"{key}-secret") if key else None)


@pytest.fixture
def secured(broker_factory, tmp_path):
    return broker_factory("--auth-file", str(write_credentials(tmp_path / "credentials.toml", USERS)))


def test_monitor_reads_but_never_writes(secured):
    w = admin(secured, "watcher")
    assert w.broker_info().role == "master"
    assert w.topics().topics is not None and w.transactions().total == 0
    for write in (lambda: w.create_topic("Orders", 2), lambda: w.act_on_transaction("nope", "commit"),
                  lambda: w.check_scan(), lambda: w.put_group("pg", {"check_max": 3})):
        with pytest.raises(AdminError) as e:
            write()
        assert (e.value.status, e.value.code) == (403, "NO_PERMISSION") and "administrator" in str(e.value)
    assert admin(secured, "admin").create_topic("Orders", 2).created


def test_whoami_answers_any_authenticated_user(secured):
    assert admin(secured, "admin").whoami() == admin(secured, "admin").whoami().__class__("admin", True, True, False)
    me = admin(secured, "watcher").whoami()
    assert (me.access_key, me.authenticated, me.admin, me.monitor) == ("watcher", True, False, True)
    me = admin(secured, "app").whoami()
    assert (me.access_key, me.admin, me.monitor) == ("app", False, False)
    with pytest.raises(AdminError) as e:
        admin(secured, "app").broker_info()  # neither admin nor monitor: no reads either
    assert e.value.status == 403
    with pytest.raises(AdminError) as e:
        admin(secured, None).whoami()
    assert e.value.status == 401


def test_whoami_without_authentication_is_everyone_admin(broker_factory):
    me = AdminClient(broker_factory().admin_url).whoami()
    assert (me.access_key, me.authenticated, me.admin) == ("", False, True)
