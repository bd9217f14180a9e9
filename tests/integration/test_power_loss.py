"""A broker on chaos/lazyfs.py, the power-loss filesystem: kill -9 under load, then the machine's
power fails (every write not fsynced is dropped), then the broker starts again on what is left.

With SYNC flush every acknowledged message and commit is still there, at the offset it was
acknowledged at (I6), and the store opens undamaged. With ASYNC flush the broker acknowledges
before fsync, so a power loss may take acknowledged messages away: how many is counted and printed,
not asserted; what is asserted is that the store opens and is consistent (what survived is a
prefix of each queue, at its acknowledged offsets, no offset twice, no rolled-back message) and
takes new writes at the next offset.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from support.brokers import BrokerProcess
from support.waiting import wait_until
from txbroker.client import (
    AsyncProducer, AsyncTransactionProducer, BrokerError, ClientError, LocalTransactionState as S, Message, Producer,
    PullConsumer, TransactionListener,
)
from txbroker.client.admin import AdminClient

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos.lazyfs import LazyFS  # noqa: E402

PLAIN, TX = "Plain", "Orders"
if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
    pytest.skip("needs FUSE: /dev/fuse and fuse3 (bash chaos/setup.sh installs it)", allow_module_level=True)
pytest.importorskip("mfusepy", reason="mfusepy is in the test extra (pip install -c constraints.txt -e '.[test]')")
pytestmark = pytest.mark.slow


class Ledger(TransactionListener):
    """Order i is rolled back if i % 4 == 0, else committed; check-backs answer the same."""

    def __init__(self):
        self.decisions: dict[str, S] = {}

    def execute_local_transaction(self, msg, i):
        msg = msg[0] if isinstance(msg, list) else msg
        self.decisions[msg.transaction_id] = S.ROLLBACK if i % 4 == 0 else S.COMMIT
        return self.decisions[msg.transaction_id]

    def check_local_transaction(self, msg):
        return self.decisions.get(msg.transaction_id, S.ROLLBACK)


class Acked:
    """What the broker acknowledged before it was killed."""

    def __init__(self):
        self.sends: dict[str, tuple[int, int]] = {}  # body -> (queue id, queue offset) acknowledged
        self.txs: dict[str, S] = {}  # body -> the decision whose END_TRANSACTION was answered
        self.enough = threading.Event()

    def count(self) -> int:
        return len(self.sends) + len(self.txs)


async def _load(address: str, acked: Acked, ledger: Ledger, enough: int, workers: int = 4) -> None:
    """Plain sends and transactions until the broker is gone; `acked.enough` is set once `enough`
    of each were acknowledged (then the test kills the broker, mid-traffic)."""

    def check():
        if len(acked.sends) >= enough and len(acked.txs) >= enough:
            acked.enough.set()

    async def sender(w: int):
        p = AsyncProducer("pl-plain", address, request_timeout=3)
        try:
            await p.start()
            for i in range(100_000):
                body = f"plain-{w}-{i}"
                r = await p.send(Message(PLAIN, body.encode()))
                acked.sends[body] = (r.queue_ids[0], r.queue_offsets[0])
                check()
        except (ClientError, OSError, asyncio.TimeoutError):
            return  # the broker is gone
        finally:
            await p.close()

    async def transactions(w: int):
        p = AsyncTransactionProducer("pl-orders", address, ledger, request_timeout=3)
        try:
            await p.start()
            for i in range(w, 100_000, workers):
                body = f"order-{i}"
                r = await p.send_message_in_transaction(Message(TX, body.encode()), i)
                if r.end_error:
                    return
                acked.txs[body] = r.local_state
                check()
        except (ClientError, OSError, asyncio.TimeoutError):
            return
        finally:
            await p.close()

    await asyncio.gather(*(sender(w) for w in range(workers)), *(transactions(w) for w in range(workers)))


@pytest.fixture
def disk(tmp_path):
    """A directory with lazyfs mounted over it, as the harness will mount it over a broker's tmpfs."""
    data = tmp_path / "disk"
    data.mkdir()
    lazy = LazyFS(data, data, control=tmp_path / "lazyfs.control", log_path=tmp_path / "lazyfs.log").start()
    brokers: list[BrokerProcess] = []
    yield lazy, brokers
    for b in brokers:  # before the unmount: a broker holding files open would keep it busy
        if b.proc is not None and b.proc.poll() is None:
            b.proc.kill()
            b.proc.wait(10)
    assert lazy.stop() == 0, lazy.log()[-2000:]


def kill_then_power_loss(disk, flush: str, enough: int = 150):
    """A broker on the lazyfs mount under load, kill -9 mid-traffic, then the power loss, then a
    restart on the same directory. Returns the broker, what it had acknowledged and lazyfs's
    answer to the power loss."""
    lazy, brokers = disk
    b = BrokerProcess(lazy.mount / "store", lazy.mount.parent / "broker.log",
                      ["--flush-disk-type", flush, "--check-interval-ms", "300", "--transaction-timeout-ms", "200"])
    brokers.append(b)
    b.start()
    acked, ledger = Acked(), Ledger()
    loader = threading.Thread(target=lambda: asyncio.run(_load(b.address, acked, ledger, enough)))
    loader.start()
    try:
        assert acked.enough.wait(60), f"the load did not get going: {acked.count()} acknowledged"
    finally:
        assert b.kill(signal.SIGKILL) == -signal.SIGKILL  # kill -9, and wait until it is gone
        loader.join(30)
    assert not loader.is_alive()
    lost_power = lazy.power_loss()
    b.start()  # same directory, same ports
    return b, acked, lost_power


def read(b: BrokerProcess, topic: str) -> list:
    with PullConsumer(b.address) as c:
        try:
            return c.read_all(topic)
        except BrokerError as e:
            if e.code_name == "TOPIC_NOT_EXIST":  # lost with everything else under ASYNC: the topic was
                return []  # created by the first send, in the same unsynced log
            raise


def store_problems(b: BrokerProcess, acked: Acked) -> list[str]:
    """What a consistent store never shows, whatever was lost: an offset twice or a gap in a queue,
    a message twice, a survivor moved from its acknowledged offset, a hole in what survived (a
    later acknowledged message kept while an earlier one in its queue is gone), a rolled-back
    message visible."""
    problems = []
    plain, orders = read(b, PLAIN), read(b, TX)
    for topic, msgs in ((PLAIN, plain), (TX, orders)):
        by_queue = defaultdict(list)
        for m in msgs:
            by_queue[m.queue_id].append(m.queue_offset)
        for q, offsets in by_queue.items():
            if sorted(offsets) != list(range(min(offsets), min(offsets) + len(offsets))):
                problems.append(f"{topic} queue {q}: offsets repeat or skip: {sorted(offsets)[:20]}...")
        twice = [body for body, n in Counter(m.body for m in msgs).items() if n > 1]
        if twice:
            problems.append(f"{topic}: delivered twice: {twice[:5]}")
    kept = {m.body.decode(): (m.queue_id, m.queue_offset) for m in plain}
    moved = {body: (at, kept[body]) for body, at in acked.sends.items() if body in kept and kept[body] != at}
    if moved:
        problems.append(f"acknowledged messages found elsewhere than acknowledged: {list(moved.items())[:5]}")
    for body, (q, offset) in acked.sends.items():
        if body not in kept and any(kq == q and ko > offset for kq, ko in kept.values()):
            problems.append(f"{body} (queue {q} offset {offset}) is gone while later ones in its queue survived")
            break
    rolled_back = [m.body.decode() for m in orders if int(m.body.decode().split("-")[1]) % 4 == 0]
    if rolled_back:
        problems.append(f"rolled-back orders visible: {rolled_back[:5]}")
    return problems


def lost(b: BrokerProcess, acked: Acked) -> tuple[list[str], list[str]]:
    """The acknowledged plain messages and committed orders not readable after the restart."""
    plain = {m.body.decode() for m in read(b, PLAIN)}
    orders = {m.body.decode() for m in read(b, TX)}
    return (sorted(set(acked.sends) - plain),
            sorted(body for body, d in acked.txs.items() if d is S.COMMIT and body not in orders))


def a_new_write_lands_at_the_next_offset(b: BrokerProcess) -> None:
    before = {m.queue_offset for m in read(b, PLAIN) if m.queue_id == 0}
    with Producer("pl-after", b.address) as p:
        r = p.send(Message(PLAIN, b"after-restart", queue_id=0))
    assert r.queue_offsets[0] == (max(before) + 1 if before else 0)
    assert [m.body for m in read(b, PLAIN) if m.queue_offset == r.queue_offsets[0] and m.queue_id == 0] \
        == [b"after-restart"]


def recovered_undamaged(b: BrokerProcess) -> None:
    log = b.log()
    assert log.count("recovered store") == 2, log[-3000:]
    assert "damaged" not in log.lower() and "corrupt" not in log.lower(), log[-3000:]
    info = AdminClient(b.admin_url).get("/api/v1/broker")
    assert info["durable_offset"] == info["log_end_offset"], info


def test_sync_flush_keeps_every_acknowledged_message_and_commit_through_a_power_loss(disk):
    b, acked, lost_power = kill_then_power_loss(disk, "SYNC")
    recovered_undamaged(b)
    lost_sends, lost_commits = lost(b, acked)
    assert not lost_sends, f"{len(lost_sends)} acknowledged messages lost: {lost_sends[:5]}"
    assert not lost_commits, f"{len(lost_commits)} acknowledged commits lost: {lost_commits[:5]}"
    assert store_problems(b, acked) == []
    a_new_write_lands_at_the_next_offset(b)
    print(f"SYNC: {len(acked.sends)} sends and {len(acked.txs)} transactions acknowledged, none lost; "
          f"the power loss dropped {lost_power['bytes']} unsynced bytes: {lost_power['paths']}")


def test_async_flush_power_loss_window_is_counted_and_the_store_stays_consistent(disk, record_property):
    b, acked, lost_power = kill_then_power_loss(disk, "ASYNC")
    recovered_undamaged(b)
    lost_sends, lost_commits = lost(b, acked)
    assert store_problems(b, acked) == []
    a_new_write_lands_at_the_next_offset(b)
    record_property("lost_acknowledged_sends", len(lost_sends))
    record_property("lost_acknowledged_commits", len(lost_commits))
    print(f"ASYNC: the power loss took {len(lost_sends)} of {len(acked.sends)} acknowledged messages and "
          f"{len(lost_commits)} of {sum(d is S.COMMIT for d in acked.txs.values())} acknowledged commits; "
          f"it dropped {lost_power['bytes']} unsynced bytes: {lost_power['paths']}")


def test_async_flush_loses_nothing_the_broker_had_synced(disk):
    """ASYNC flush acknowledges before fsync, and syncs its log every --flush-interval-ms (RocketMQ's
    flushIntervalCommitLog): a power loss takes at most what came after the last sync, which the
    broker shows as `synced_offset`. Before the periodic sync, a power loss took every message since
    the last memtable flush (all 301 of 301 acknowledged, in one run), however long ago."""
    lazy, brokers = disk
    b = BrokerProcess(lazy.mount / "store", lazy.mount.parent / "broker.log",
                      ["--flush-disk-type", "ASYNC", "--flush-interval-ms", "200"])
    brokers.append(b)
    b.start()
    admin = AdminClient(b.admin_url)
    with Producer("pl-synced", b.address) as p:
        early = {f"early-{i}": p.send(Message(PLAIN, f"early-{i}".encode())) for i in range(200)}
    end = admin.get("/api/v1/broker")["log_end_offset"]
    wait_until(lambda: admin.get("/api/v1/broker")["synced_offset"] >= end, what="the log synced through the sends")
    with Producer("pl-synced", b.address) as p:  # after the sync: these may or may not survive
        for i in range(50):
            p.send(Message(PLAIN, f"late-{i}".encode()))
    assert b.kill(signal.SIGKILL) == -signal.SIGKILL
    lazy.power_loss()
    b.start()
    kept = {m.body.decode() for m in read(b, PLAIN)}
    assert set(early) <= kept, f"{len(set(early) - kept)} of the synced messages lost: {sorted(set(early) - kept)[:5]}"


def test_a_master_that_lost_its_tail_to_a_power_loss_hands_over_to_the_slave_that_has_it(tmp_path, disk):
    """ASYNC flush, SYNC replication: the master acknowledges what its slave has, before fsync. Its
    power fails and it starts again as master (quicker than the failover grace) without the records
    its slave holds. It must not cut the slave back to its own log (that took 100 acknowledged
    messages in one run) nor write over them: it takes no write until it has compared its log with
    a slave's, finds the slave ahead at its own epoch, and steps down, so that the slave is promoted
    with everything acknowledged."""
    lazy, brokers = disk
    flags = ["--flush-disk-type", "ASYNC", "--flush-interval-ms", "60000", "--replication-mode", "SYNC",
             "--replication-timeout-ms", "2000", "--replication-heartbeat-ms", "200"]
    m = BrokerProcess(lazy.mount / "store", tmp_path / "master.log", flags)
    brokers.append(m)
    m.start()
    s = BrokerProcess(tmp_path / "slave", tmp_path / "slave.log", [*flags, "--role", "slave", "--master", m.address])
    brokers.append(s)
    s.start()
    wait_until(lambda: any(x["in_sync"] for x in AdminClient(m.admin_url).get("/api/v1/broker")["replication"]["slaves"]),
               what="the slave in sync")
    with Producer("pl-tail", m.address) as p:
        acked = {f"m-{i}" for i in range(100) if p.send(Message(PLAIN, f"m-{i}".encode()))}
    assert m.kill(signal.SIGKILL) == -signal.SIGKILL
    assert lazy.power_loss()["bytes"] > 0  # the master's unsynced log went with the power
    m.start()  # as master again, at the same epoch
    wait_until(lambda: AdminClient(m.admin_url).get("/api/v1/broker")["role"] == "slave",
               what="the master stepping down once its slave shows records it lost")
    assert "lost records its slave" in m.log(), m.log()[-2000:]
    with pytest.raises(ClientError) as refused:  # it takes no write meanwhile: no master answers there
        Producer("pl-tail", m.address, request_timeout=2).send(Message(PLAIN, b"into the gap"))
    assert "no master" in str(refused.value), refused.value
    assert "truncat" not in s.log(), s.log()[-2000:]
    epoch = AdminClient(s.admin_url).get("/api/v1/broker")["epoch"] + 1  # the operator's failover
    AdminClient(s.admin_url).post("/api/v1/role", {"role": "master", "epoch": epoch})
    AdminClient(m.admin_url).post("/api/v1/role", {"role": "slave", "master": s.address, "epoch": epoch})
    kept = {x.body.decode() for x in read(s, PLAIN)}
    assert acked <= kept, f"{len(acked - kept)} acknowledged messages lost: {sorted(acked - kept)[:5]}"
    end = AdminClient(s.admin_url).get("/api/v1/broker")["log_end_offset"]
    wait_until(lambda: AdminClient(m.admin_url).get("/api/v1/broker")["log_end_offset"] >= end,
               what="the old master following the new one, caught up")
