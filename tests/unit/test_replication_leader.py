"""The master's side of replication on its own: a push goes to a slave only when it continues that
slave's log; otherwise the slave is caught up from disk (second review, defect 5: a live slave
whose next record the push did not start at was silently skipped, for good)."""

import asyncio
from types import SimpleNamespace

from txbroker.broker.role import RoleState
from txbroker.broker.replication.leader import ReplicaFeed, ReplicationLeader
from txbroker.protocol.bodies import Message
from txbroker.protocol.codes import RequestCode
from txbroker.store.records import NormalRecord
from txbroker.store.state import StateMachine


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


def test_a_live_slave_the_push_does_not_continue_is_caught_up_from_disk(tmp_path):
    async def main():
        state = StateMachine(str(tmp_path), False, lambda e: None)
        config = SimpleNamespace(replication_mode="ASYNC", sync_replicas=1, replication_timeout_ms=1000,
                                 replication_heartbeat_ms=60_000)
        leader = ReplicationLeader(SimpleNamespace(state=state, config=config, role=RoleState("master", lambda: 1)))
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
