"""The operator and a real broker agree on broker groups: a broker starts on the route file the
operator renders (as the `<name>-route` ConfigMap mounts it), reloads it when the operator writes a
higher version, and answers the operator's questions about a draining group (GET /api/v1/cluster,
GET /api/v1/drain) in the form the operator reads."""

from __future__ import annotations

from support.waiting import wait_until
from txbroker.client import Message, Producer
from txbroker_operator import brokers, route
from txbroker_operator import constants as c


def groups(g1_state: str) -> list[route.GroupRoute]:
    return [route.group_route("orders", "shop", 0, 2, route.ACTIVE), route.group_route("orders", "shop", 1, 2, g1_state)]


def test_a_broker_runs_the_route_the_operator_writes_and_reports_its_drain(broker_factory, tmp_path, monkeypatch):
    path = tmp_path / "route.yaml"
    path.write_text(route.document("orders", 3, groups(route.DRAINING)))
    b = broker_factory("--group", "g1", "--cluster-file", str(path), name="g1")
    monkeypatch.setattr(c, "ADMIN_PORT", b.admin_port)   # the operator asks pods on the fixed admin port
    access = brokers.PLAIN
    assert access.route_version("127.0.0.1") == 3
    drain = access.drain("127.0.0.1")
    assert (drain.group, drain.draining, drain.undelivered, drain.drained) == ("g1", True, 0, True)

    path.write_text(route.document("orders", 4, groups(route.ACTIVE)))       # active again, a higher version
    wait_until(lambda: access.route_version("127.0.0.1") == 4, 30, "the broker to reload the route")
    with Producer("p", b.address) as p:
        p.send(Message("Orders", b"kept"))
    drain = access.drain("127.0.0.1")
    assert (drain.draining, drain.undelivered, drain.topics, drain.drained) == (False, 1, {"Orders": 1}, False)

    path.write_text(route.document("orders", 2, groups(route.DRAINING)))     # lower: the broker keeps 4
    wait_until(lambda: "older than version 4" in b.log(), 30, "the broker to refuse the older route")
    assert access.route_version("127.0.0.1") == 4 and not access.drain("127.0.0.1").draining
