"""The cluster clients' pieces that decide without a broker: the route book keeps the newest route
and follows it again until every part did; placement spreads sends and passes over failed groups."""

import asyncio

import pytest

from txbroker.client.cluster.placement import Placement
from txbroker.client.cluster.route import RouteBook
from txbroker.protocol.bodies import Message
from txbroker.protocol.cluster import ClusterRoute, GroupRoute, RouteError, parse_route


def route(version, *names, draining=()):
    return ClusterRoute("c", version, [GroupRoute(n, [f"h{n}:1"], "draining" if n in draining else "active")
                                       for n in names])


class Book(RouteBook):
    """A RouteBook whose fetch answers from a list (the one piece under test: what it keeps)."""

    def __init__(self, answers):
        super().__init__("127.0.0.1:1")
        self.answers = list(answers)

    async def fetch(self):
        return self.answers.pop(0)


def test_the_route_book_keeps_the_newest_route_and_follows_again_what_it_followed_in_part():
    async def main():
        book = Book([route(3, "g0", "g1"), route(2, "g0"), route(3, "g0", "g1"), route(3, "g0", "g1")])
        seen, complete = [], [False, True]
        book.on_change(lambda r: _record(seen, r, complete))
        assert await book.update() and book.route.version == 3
        assert not await book.update() and book.route.version == 3  # a lagging broker's older route: kept 3
        assert await book.update()  # same version, followed only in part before: followed again
        assert not await book.update()  # now fully followed: nothing to do
        assert [r.version for r in seen] == [3, 3]
        await book.close()

    asyncio.run(main())


async def _record(seen, r, complete):
    seen.append(r)
    return complete.pop(0)


def test_placement_turns_over_active_groups_and_passes_over_a_failed_one_for_a_while():
    async def main():
        p = Placement()
        count = lambda g, t: asyncio.sleep(0, 4)  # noqa: E731 - four queues per group
        msgs = [Message("T", b"x")]
        turns = [next(iter(await p.place(msgs, ["g0", "g1"], count))) for _ in range(4)]
        assert turns == ["g0", "g1", "g0", "g1"]
        p.avoid("g1", 60)
        assert {next(iter(await p.place(msgs, ["g0", "g1"], count))) for _ in range(4)} == {"g0"}
        keyed = await p.place([Message("T", b"a"), Message("T", b"b")], ["g0", "g1"], count,
                              lambda n, m, a: 0 if m.body == b"a" else n - 1)
        assert {g: [(m.body, m.queue_id) for m in ms] for g, ms in keyed.items()} == {"g0": [(b"a", 0)],
                                                                                       "g1": [(b"b", 3)]}
        with pytest.raises(ValueError, match="every group in the route is draining"):
            await p.place(msgs, [], count)

    asyncio.run(main())


@pytest.mark.parametrize("doc, words", [
    ({"cluster": "c", "version": 0, "groups": [{"name": "g0", "addresses": ["h:1"]}]}, "version 0: must be 1 or more"),
    ({"cluster": "c", "version": 1, "groups": [{"name": "g0", "addresses": ["h:1"]}] * 2}, "'g0' appears twice"),
    ({"cluster": "c", "version": 1, "groups": [{"name": "g0", "addresses": ["h:1"], "state": "draining"}]},
     "every group is draining"),
    ({"cluster": "c", "version": 1, "groups": [{"name": "g0", "addresses": []}]}, "lists no broker"),
    ({"cluster": "c", "version": 1, "groups": [{"name": "g0", "addresses": ["h:1"], "weight": 2}]}, "weight"),
])
def test_a_route_that_cannot_be_used_is_refused_naming_the_field(doc, words):
    with pytest.raises(RouteError, match=words):
        parse_route(doc)
