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
        got = [SimpleNamespace(queue_offset=o, body=self.log[o].encode(), properties={}) for o in range(offset, min(end, offset + n))]
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
        got = [SimpleNamespace(queue_offset=o, body=self.log[o].encode(), properties={})
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


class Restarting(Master):
    """A master that is down, restarting or on probation: every pull fails."""

    def __init__(self, log: dict[int, str]):
        super().__init__(log)
        self.down = False

    async def pull(self, topic, q, offset, n):
        if self.down:
            raise BrokerError("b3", "PULL_MESSAGE", ResponseCode.SLAVE_NOT_AVAILABLE,
                              "this master started again and takes no write until a slave shows it lost nothing")
        return await super().pull(topic, q, offset, n)


def test_what_was_read_before_an_outage_is_read_again_though_the_queue_was_refilled_past_it():
    """Seed 706 (ASYNC_FLUSH): a whole group's power cut took offset 4 (a check-back's COMMIT, read
    just before the cut, never fsynced); while the group restarted every pull failed, and by the first
    pull that answered, new writes had filled the queue past the reader's next offset 5: no `went
    back`, no re-read, so the record kept t1-4719.0 at 4, read again where check-back committed it a
    second time (a `duplicate`), and never saw job220.1, now at 4. A queue whose pull failed is read
    again below its next offset on the first pull that succeeds."""
    r = Reader(lambda: {}, topics=("Orders",))
    master = Restarting({0: "a0", 1: "a1", 2: "a2", 3: "a3", 4: "t1-4719.0"})
    asyncio.run(r._read_group("g1", master))
    master.log, master.down = {o: b for o, b in master.log.items() if o < 4}, True  # the cut takes 4
    asyncio.run(r._read_group("g1", master))
    master.log.update({4: "job220.1", 5: "t1-4950.0", 6: "t1-4719.0"})
    master.down = False
    asyncio.run(r._read_group("g1", master))
    assert {b: p for b, p in r.bodies("Orders").items() if b in ("t1-4719.0", "job220.1")} == {
        "t1-4719.0": [("g1", 0, 6)], "job220.1": [("g1", 0, 4)]}
    assert r.rewritten == ["g1 Orders:0 offset 4: read 't1-4719.0', later 'job220.1'"]


class Keyed(Master):
    """A master whose messages carry unique keys, with its key index (`index`: key -> bodies found)
    and a queue start (retention)."""

    def __init__(self, log: dict[int, str], index: dict[str, list[str]], start: int = 0):
        super().__init__(log)
        self.index, self.start = index, start

    async def pull(self, topic, q, offset, n):
        offset = max(offset, self.start)
        end = max(self.log) + 1
        got = [SimpleNamespace(queue_offset=o, body=self.log[o].encode(), properties={}, keys=f"k{o}")
               for o in range(offset, min(end, offset + n)) if o in self.log]
        return SimpleNamespace(messages=got, next_offset=offset + len(got), max_offset=end)

    async def search_offset(self, topic, q, ts):
        return max(self.log) + 1 if ts else self.start

    async def find_by_key(self, topic, key):
        return [SimpleNamespace(body=b.encode()) for b in self.index.get(key, [])]

    def delete(self, offset):
        del self.log[offset]


def test_every_keyed_message_of_the_last_pass_is_read_by_its_key():
    """The key index is written behind the log (store/derived/key_index.py): at the end, each keyed
    message still stored must be found by its key, and nothing else under it."""
    log = {o: f"m{o}" for o in range(6)}
    index = {f"k{o}": [f"m{o}"] for o in range(6)}
    index["k2"] = []                   # lost: its entry never written
    index["k4"] = ["m4", "stale-7"]    # a stale entry of a dropped record, pointing elsewhere
    m = Keyed(log, index)
    r = Reader(lambda: {}, topics=("Orders",))
    asyncio.run(r._read_group("g0", m))
    r.last_pass = True
    asyncio.run(r._verify_all("g0", m))
    r.last_pass = False
    m.start = 1
    m.index["k0"] = []                 # retention deleted m0 after the last pass: passed over
    m.delete(3)                        # and m3, above a record it kept (the queue starts below it)
    m.index["k3"] = []
    asyncio.run(r._verify_keys("g0", m))
    assert r.keys_checked == 4
    assert r.key_lost == ["g0 Orders:0 offset 2 m2: not found by its key 'k2'"]
    assert r.key_phantom == ["g0 Orders key 'k4' of m4: also finds stale-7"]
