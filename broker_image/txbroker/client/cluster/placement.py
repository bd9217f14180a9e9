"""Where a send's messages go in a cluster: which broker group, and which queue there.

Without a selector a send goes whole to one active group, the next in turn (as RocketMQ sends a
batch to one queue): a transaction then stays on one group, decided as on a single broker group. A
group whose send just failed is passed over for a few seconds (`avoid`).
With a selector (e.g. hash_selector by key) each message goes to its own (group, queue): the
selector chooses among all queues of the topic on the active groups, in route order, so one key
always lands on one queue while the groups stay the same (adding or draining a group moves keys,
as adding partitions does in Kafka). A transaction whose messages land on several groups spans them
(client/cluster/transaction.py)."""

from __future__ import annotations

import itertools
import time
from typing import Awaitable, Callable

from txbroker.protocol.bodies import Message

CountOf = Callable[[str, str], Awaitable[int]]  # (group, topic) -> queue count on that group
AVOID_SECONDS = 3.0  # a group whose send failed is passed over this long by sends without a selector


class Placement:
    def __init__(self):
        self._turn = itertools.count()
        self._counts: dict[tuple[str, str], int] = {}
        self._avoid: dict[str, float] = {}  # group -> until when (monotonic) sends pass it over

    def avoid(self, group: str, seconds: float = AVOID_SECONDS) -> None:
        """A send to `group` failed (no master, a failover under way): the next sends without a
        selector go to the other groups for a while, as RocketMQ's producer avoids a faulty broker.
        The failed send itself is the caller's to handle: it may have been stored."""
        self._avoid[group] = time.monotonic() + seconds

    def forget(self) -> None:
        """The groups changed: queue counts are asked again."""
        self._counts.clear()

    async def place(self, msgs: list[Message], active: list[str], count_of: CountOf, selector=None,
                    arg=None) -> dict[str, list[Message]]:
        """The messages by group, in the order the groups first appear in `msgs`."""
        if not active:
            raise ValueError("no broker group takes new messages (every group in the route is draining)")
        if selector is None:
            now = time.monotonic()
            usable = [g for g in active if self._avoid.get(g, 0) <= now] or active
            return {usable[next(self._turn) % len(usable)]: msgs}
        parts: dict[str, list[Message]] = {}
        for m in msgs:
            counts = [(g, await self._count(g, m.topic, count_of)) for g in active]
            total = sum(n for _, n in counts)
            index = selector(total, m, arg)
            if not 0 <= index < total:
                raise ValueError(f"the selector chose queue {index} of topic {m.topic}, which has {total} queues "
                                 f"on groups {', '.join(active)}")
            for g, n in counts:
                if index < n:
                    m.queue_id = index
                    parts.setdefault(g, []).append(m)
                    break
                index -= n
        return parts

    async def _count(self, group: str, topic: str, count_of: CountOf) -> int:
        key = (group, topic)
        n = self._counts.get(key)
        if n is None:
            n = self._counts[key] = await count_of(group, topic)
        return n
