"""When a slave counts as in sync for a backup (ReplicationFollower.out_of_sync, broker/backup.py):
connected, heard from its master within a few heartbeats, holding all its master had published.
Each other case is refused with words saying which."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from txbroker.broker.replication.follower import ReplicationFollower


def follower(next_lsn: int) -> ReplicationFollower:
    broker = SimpleNamespace(state=SimpleNamespace(next_lsn=next_lsn),
                             config=SimpleNamespace(broker_name="s", replication_heartbeat_ms=100))
    return ReplicationFollower(broker, "10.0.0.1:10911")


def judge(f: ReplicationFollower, connected: bool, published: int | None, silent_s: float) -> str:
    async def go():
        f.connected, f.master_published = connected, published
        f._heard = asyncio.get_running_loop().time() - silent_s
        return f.out_of_sync(3)
    return asyncio.run(go())


def test_a_slave_holding_what_its_master_published_and_hearing_from_it_is_in_sync():
    assert judge(follower(41), True, 40, 0.05) == ""
    assert judge(follower(41), True, -1, 0.05) == ""   # a master that does not say: as far as it is heard


def test_each_other_case_is_refused_saying_which():
    f = follower(41)
    f.last_error = "ConnectionRefusedError: refused"
    why = judge(f, False, 40, 0.05)
    assert why.startswith("slave s is not in sync with its master 10.0.0.1:10911: not connected") and "refused" in why
    assert "nothing heard from it for 0.5s" in judge(follower(41), True, 40, 0.5)     # 5 heartbeats of silence
    assert "nothing heard" in judge(follower(41), True, None, 0.0)   # subscribed, no word yet on this link
    assert "it holds the log to LSN 30, its master had published LSN 40" in judge(follower(31), True, 40, 0.05)
