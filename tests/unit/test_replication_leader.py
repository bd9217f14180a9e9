"""The master's side of replication on its own: a push goes to a slave only when it continues that
slave's log; otherwise the slave is caught up from disk (second review, defect 5: a live slave
whose next record the push did not start at was silently skipped, for good)."""

import asyncio
from types import SimpleNamespace

from txbroker.broker.replies import RequestError
from txbroker.broker.role import RoleState
from txbroker.broker.replication.leader import ReplicaFeed, ReplicationLeader
from txbroker.protocol.bodies import Message
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.store.records import NormalRecord
from txbroker.store.state import PUBLISHED_KEY, StateMachine


class Link:
    """A slave's connection as the leader sees it: what was pushed, in order."""

    def __init__(self):
        self.pushed: list[tuple[int, int]] = []  # (first LSN, records)

    def writable(self) -> bool:
        return True

    def send_oneway(self, code, msg) -> None:
        assert code == RequestCode.REPLICATION_PUSH
        if msg.records:
            self.pushed.append((msg.first_lsn, len(msg.records)))

    async def drained(self) -> None:
        await asyncio.sleep(0)

    def close(self) -> None:
        pass


def _leader(tmp_path, mode: str, sync_replicas: int = 1, controlled: bool = False):
    """A real store and its master's replication leader, without a broker around them."""
    state = StateMachine(str(tmp_path), False, lambda e: None)
    config = SimpleNamespace(replication_mode=mode, sync_replicas=sync_replicas, replication_timeout_ms=1000,
                             replication_heartbeat_ms=60_000, broker_name="m", await_role_confirmation=controlled)
    return state, ReplicationLeader(SimpleNamespace(state=state, config=config, role=RoleState("master", lambda: 1)))


def test_a_live_slave_the_push_does_not_continue_is_caught_up_from_disk(tmp_path):
    async def main():
        state, leader = _leader(tmp_path, "ASYNC")
        leader.attach()
        for i in range(3):  # LSNs 1-3, written before the slave's feed goes live
            await state.append(NormalRecord(i, [Message("T", b"x", queue_id=0)], [i]))[1]
        link = Link()
        feed = leader.feeds[link] = ReplicaFeed(link, "s", "", next_lsn=2)  # it has LSN 1 only
        feed.live = True
        await state.append(NormalRecord(9, [Message("T", b"y", queue_id=0)], [3]))[1]  # LSN 4: not the slave's next
        for _ in range(20):
            await asyncio.sleep(0)
        assert link.pushed and link.pushed[0][0] == 2, link.pushed  # from its next record, read from disk
        assert sum(n for _first, n in link.pushed) == 3 and feed.next_lsn == 5
        leader.detach("test over")
        await state.close()

    asyncio.run(main())


async def _outcome(fut) -> str:
    try:
        await fut
        return "acknowledged"
    except RequestError as e:
        return ResponseCode(e.code).name


def test_a_write_in_flight_when_the_master_steps_down_is_neither_acknowledged_nor_published(tmp_path):
    """A send passed require_master and was appended; in the same loop turn the master was fenced
    or demoted (the leader detached) before the batch was written. Found by review: the batch was
    then written with no leader, published and answered SUCCESS with no slave holding it."""
    async def main():
        state, leader = _leader(tmp_path, "SYNC")
        leader.attach()
        lsn, written = state.append(NormalRecord(1, [Message("T", b"w", queue_id=0)], [0]))
        leader.detach("fenced by epoch 2")            # the same turn: the batch is not written yet
        outcome = await _outcome(written)
        published, mark = state.durable_lsn, state.db.meta.get(PUBLISHED_KEY)
        await state.close()
        return lsn, outcome, published, mark

    lsn, outcome, published, mark = asyncio.run(main())
    assert outcome == "SLAVE_NOT_AVAILABLE"
    assert published < lsn and mark is not None, "the unreplicated write was published"


def test_an_empty_barrier_does_not_make_an_unreplicated_write_look_published(tmp_path):
    """UPDATE_AND_CREATE_TOPIC of a topic that exists appends nothing and waits on the store's
    barrier. Found by review: that wrote an empty batch, which set the locally written end to 0, so
    a retried request for an unreplicated write was answered SUCCESS at once."""
    async def main():
        state, leader = _leader(tmp_path, "SYNC")
        leader.attach()
        lsn, written = state.append(NormalRecord(1, [Message("T", b"w", queue_id=0)], [0]))
        first = await _outcome(written)               # no slave in sync: refused, kept unpublished
        try:
            waiting = state.barrier()                  # the topic exists: nothing appended
            barrier = "acknowledged" if waiting is None else await _outcome(waiting)
        except RequestError as e:
            barrier = ResponseCode(e.code).name
        try:
            retried = state.published_future(lsn)
            retried = "acknowledged" if retried is None else await _outcome(retried)
        except RequestError as e:
            retried = ResponseCode(e.code).name
        local = state.local_durable_lsn
        leader.detach("test over")
        await state.close()
        return lsn, first, barrier, retried, local

    lsn, first, barrier, retried, local = asyncio.run(main())
    assert first == "SLAVE_NOT_AVAILABLE" and local == lsn
    assert barrier != "acknowledged" and retried != "acknowledged", (barrier, retried)


def test_an_async_master_writes_no_published_mark_and_restarts_with_everything_readable(tmp_path):
    """The published mark is a SYNC master's: an ASYNC master publishes what it writes, so a
    restart hides nothing (review of 8eb9917: the batch's hold had made every batch write it)."""
    async def main():
        state, leader = _leader(tmp_path, "ASYNC")
        leader.attach()
        for i in range(3):
            await state.append(NormalRecord(i, [Message("T", b"x", queue_id=0)], [i]))[1]
        mark = state.db.meta.get(PUBLISHED_KEY)
        leader.detach("test over")
        await state.close()
        again = StateMachine(str(tmp_path), False, lambda e: None)
        readable = again.durable_lsn, again.local_durable_lsn
        await again.close()
        return mark, readable

    mark, (durable, written) = asyncio.run(main())
    assert mark is None and durable == written == 3, (mark, durable, written)


def test_a_forgotten_slave_leaves_the_sync_set_only_when_that_keeps_failovers_whole(tmp_path):
    """With one acknowledgement making a write, an approved slave holding all a forgotten one had
    covers it; with k of them it does not (failover's n - k + 1 would miss a holder): only a
    person's forget-slave (no covering slave named) takes it out then."""
    for k, by, stays in ((1, "b", False), (1, "x", True), (2, "b", True), (2, None, False)):
        _, leader = _leader(tmp_path / f"{k}-{by}", "SYNC", sync_replicas=k, controlled=True)
        leader.approve(["a", "b", "c"])
        leader.slaves.on_forget("a", by)
        assert ("a" in leader.approved) is stays, (k, by, leader.approved)
