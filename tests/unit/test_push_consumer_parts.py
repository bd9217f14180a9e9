"""The push consumer's parts that need no broker: how queues are shared among members, what an offset
store commits (concurrent and orderly) and keeps in its file, and the retry back-off."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from txbroker.client.push import allocate_averagely
from txbroker.client.push.offsets import LocalOffsetStore
from txbroker.client.push.process_queue import ProcessQueue
from txbroker.client.push.retrying import Retrying


def test_queues_are_shared_in_contiguous_even_shares():
    queues = [("T", q) for q in range(7)]
    members = ["a", "b", "c"]
    shares = [allocate_averagely(queues, members, me) for me in members]
    assert shares == [queues[0:3], queues[3:5], queues[5:7]]
    assert allocate_averagely(queues, members, "not-a-member") == []
    assert allocate_averagely(queues[:2], members, "c") == []  # more members than queues


def test_local_store_commits_what_is_done_and_reads_it_back(tmp_path):
    path = str(tmp_path / "offsets" / "g.json")
    concurrent = LocalOffsetStore(path, orderly=False)
    q0 = ProcessQueue("T", 0, next_pull=10, in_flight={4, 7})
    q1 = ProcessQueue("T", 1, next_pull=3)
    asyncio.run(concurrent.commit([q0, q1]))
    # the oldest batch still in the listener holds its queue's offset back
    assert (q0.committed, q1.committed) == (4, 3)
    assert json.loads(Path(path).read_text()) == {"T": {"0": 4, "1": 3}}
    assert concurrent.committed("T", on_broker={0: 99}) == {0: 4, 1: 3}
    assert concurrent.committed("Other", on_broker={0: 99}) == {}

    orderly = LocalOffsetStore(path, orderly=True)
    q2 = ProcessQueue("T", 2, next_pull=20, consumed_to=12)
    asyncio.run(orderly.commit([q2]))
    assert json.loads(Path(path).read_text()) == {"T": {"0": 4, "1": 3, "2": 12}}


def test_store_writes_nothing_when_nothing_moved(tmp_path):
    path = tmp_path / "g.json"
    store = LocalOffsetStore(str(path), orderly=False)
    asyncio.run(store.commit([ProcessQueue("T", 0, next_pull=5, committed=5)]))
    assert not path.exists()


def test_retry_pause_doubles_up_to_the_maximum_and_resets_on_success():
    r = Retrying("test", first_delay=0.5, max_delay=10.0)
    pauses = [r.failed(RuntimeError("refused")) for _ in range(7)]
    assert pauses == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    r.succeeded()
    assert r.failures == 0 and r.failed(RuntimeError("refused")) == 0.5


def test_orderly_consumption_that_loses_its_lock_pulls_again_from_the_first_unconsumed_message(tmp_path):
    """A member that loses a queue's lock halfway through a pulled set (a renewal refused after the
    lease ran out) stops there; when it holds the lock again it must go on from the first message it
    did not consume, not from the end of the set (it skipped them, and a commit moved past them)."""
    from txbroker.client.push.consuming import Listener, OrderlyConsumption
    from txbroker.client.push.member import Member
    from txbroker.client.push.pulling import Puller
    from txbroker.client.push.structs import ConsumeOrderlyStatus
    from txbroker.protocol.bodies import MessageExt, PullResponse

    class Broker:  # answers one pull: offsets 0-3 of queue T:0
        request_timeout = 1.0

        async def request(self, code, body, response_type=None, **_):
            msgs = [MessageExt(f"m{i}", "T", 0, i, b"x") for i in range(4)]
            return PullResponse(msgs, next_offset=4)

    class Locks:  # held for the first two batches, then lost
        retry_after = 0.0

        def __init__(self):
            self.answers = [True, True, True, False]

        async def hold(self, q):
            return self.answers.pop(0)

    consumed = []

    async def listener(msgs, ctx):
        consumed.extend(m.queue_offset for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS

    async def main():
        member = Member("g", "c1", Broker(), running=True)
        locks = Locks()
        orderly = OrderlyConsumption(member, Listener(listener, None), locks,
                                     LocalOffsetStore(str(tmp_path / "g.json"), orderly=True), batch_max=1, suspend_s=0)
        q = ProcessQueue("T", 0, next_pull=0)
        await Puller(member, orderly, locks, tags="*", pull_batch=32, long_poll_ms=0)._pull_and_consume(q)
        return q

    q = asyncio.run(main())
    assert consumed == [0, 1]
    assert q.next_pull == 2 and q.consumed_to == 2
