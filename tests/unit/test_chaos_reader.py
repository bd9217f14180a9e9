"""chaos/reader.py, the harness's record of what the cluster served, against a stand-in master whose
queue is cut (the fault harness, seed 603 under ASYNC: after a whole group's power cut the new
master's queue ended below what was read; the reader went on from the new end, so its record of the
positions just below it was still the old master's, and a transaction's END replayed there later
read as a duplicate). After a cut the positions below the new end are read again."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos import reader as reader_module  # noqa: E402
from chaos.reader import Reader  # noqa: E402
from txbroker.client import BrokerError  # noqa: E402
from txbroker.protocol.codes import ResponseCode  # noqa: E402


class Master:
    """One queue of Orders, as its master serves it: `log` is offset -> body."""

    def __init__(self, log: dict[int, str]):
        self.log = log

    async def queue_count(self, topic):
        return 1

    async def pull(self, topic, q, offset, n):
        end = max(self.log) + 1 if self.log else 0
        if offset > end:
            raise BrokerError("b0", "PULL_MESSAGE", ResponseCode.PULL_OFFSET_MOVED,
                              f"offset {offset} is beyond the end {end}")
        got = [SimpleNamespace(queue_offset=o, body=self.log[o].encode()) for o in range(offset, min(end, offset + n))]
        return SimpleNamespace(messages=got, next_offset=offset + len(got), max_offset=end)

    async def search_offset(self, topic, q, ts):
        return max(self.log) + 1 if ts else 0


def test_after_a_cut_what_was_read_below_the_new_end_is_read_again_from_the_new_master():
    r = Reader(lambda: {}, topics=("Orders",))
    old = Master({o: f"old-{o}" for o in range(10)})
    asyncio.run(r._read_group("g0", old))
    assert r.next[("g0", "Orders", 0)] == 10
    # the new master lost 7-9 and holds other records at 5 and 6 (diverged before the cut)
    new = Master({**{o: f"old-{o}" for o in range(5)}, 5: "new-5", 6: "new-6"})
    asyncio.run(r._read_group("g0", new))
    assert r.went_back and r.next[("g0", "Orders", 0)] == 7
    assert {b: p for b, p in r.bodies("Orders").items() if not b.startswith("old-") or b in ("old-5", "old-6")} == {
        "new-5": [("g0", 0, 5)], "new-6": [("g0", 0, 6)]}
    assert len(r.rewritten) == 2


def test_without_the_re_read_the_old_masters_records_stay_in_the_record(monkeypatch):
    """What the fix changed: with no positions read again, the record keeps old-5 and old-6."""
    monkeypatch.setattr(reader_module, "REREAD_AFTER_CUT", 0)
    r = Reader(lambda: {}, topics=("Orders",))
    asyncio.run(r._read_group("g0", Master({o: f"old-{o}" for o in range(10)})))
    asyncio.run(r._read_group("g0", Master({**{o: f"old-{o}" for o in range(5)}, 5: "new-5", 6: "new-6"})))
    assert "old-5" in r.bodies("Orders") and "new-5" not in r.bodies("Orders")


class Gapped(Master):
    """A master whose pull in a gap reads nothing and moves no further (the read path before the
    fix of seed 556)."""

    async def pull(self, topic, q, offset, n):
        got = [SimpleNamespace(queue_offset=o, body=self.log[o].encode())
               for o in range(offset, offset + n) if o in self.log]
        end = max(self.log) + 1
        return SimpleNamespace(messages=got, next_offset=(got[-1].queue_offset + 1) if got else offset,
                               max_offset=end)


def test_a_queue_that_cannot_be_read_past_a_gap_from_its_start_is_flagged():
    r = Reader(lambda: {}, topics=("Orders",))
    asyncio.run(r._read_group("g0", Master({o: f"m-{o}" for o in range(200)})))  # read live, whole
    gapped = Gapped({0: "m-0", **{o: f"m-{o}" for o in range(100, 200)}})  # retention emptied 1-99
    asyncio.run(r._verify_all("g0", gapped))
    assert r.stuck == ["g0 Orders:0: a pull from offset 1 reads nothing and moves no further, though the queue "
                       "goes on to 200"]
    r.stuck.clear()
    asyncio.run(r._verify_all("g0", Master({o: f"m-{o}" for o in range(200)})))  # nothing missing: nothing said
    assert r.stuck == []
