"""The Spark data source's route (txbroker_spark/cluster.py, learn_route) on a stand-in route book,
without Spark or brokers: a draining group gets no rows of a new write, and a route with no active
group is refused naming the option."""

from __future__ import annotations

import pytest

from txbroker.protocol.cluster import ClusterRoute, GroupRoute
from txbroker_spark import cluster
from txbroker_spark.option_values import OptionError
from txbroker_spark.security import BrokerSecurity


class Book:
    def __init__(self, route: ClusterRoute):
        self.route = route

    async def fetch(self) -> ClusterRoute:
        return self.route

    async def close(self) -> None:
        pass


class Client:
    def __init__(self, addresses, **_):
        self.addresses = addresses

    async def close(self) -> None:
        pass


@pytest.fixture
def route_book(monkeypatch):
    def use(route: ClusterRoute) -> None:
        monkeypatch.setattr(cluster, "RouteBook", lambda *a, **k: Book(route))
        monkeypatch.setattr(cluster, "BrokerClient", Client)

        async def count(client, topic):
            return 4

        monkeypatch.setattr(cluster, "_count", count)
    return use


def test_a_draining_group_gets_no_rows_of_a_new_write(route_book):
    route_book(ClusterRoute("txb", 7, [GroupRoute("g0", ["a:1"]), GroupRoute("g1", ["b:1"], "draining"),
                                       GroupRoute("g2", ["c:1"])]))
    w = cluster.learn_route(["a:1"], "Orders", BrokerSecurity(), 5)
    assert (w.names, w.counts, w.version) == (["g0", "g2"], (4, 4), 7)


def test_a_route_with_no_active_group_is_refused_naming_brokers(route_book):
    route_book(ClusterRoute("txb", 9, [GroupRoute("g0", ["a:1"], "draining")]))
    with pytest.raises(OptionError) as e:
        cluster.learn_route(["a:1"], "Orders", BrokerSecurity(), 5)
    assert "brokers" in str(e.value) and "lists no active broker group (g0: draining)" in str(e.value)
