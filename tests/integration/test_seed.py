"""A slave that cannot go on from its own store seeds itself from a copy of its master's (real
brokers, real RocksDB files damaged on disk): a damaged file is detected and never served; a slave
whose master's retention deleted what it needs is seeded instead of refused for good."""

from __future__ import annotations

import glob
import os
from collections import Counter

import pytest

from support.brokers import BrokerProcess
from support.metrics import metric
from support.pairs import SYNC_FLAGS, sync_pair
from support.waiting import wait_until
from txbroker.client import BrokerError, Message, Producer, PullConsumer
from txbroker.client.errors import ClientError
from txbroker.client.admin import AdminClient
from txbroker.client.connection import BrokerClient
from txbroker.protocol.bodies import SnapshotRequest, SnapshotResponse
from txbroker.protocol.codes import RequestCode
from txbroker.store.db import open_database

EXIT_STORE_DAMAGED, EXIT_RESEED = 71, 72


def info(b):
    return AdminClient(b.admin_url).broker_info()


def fill(m, n=400, topic="Seeded"):
    with Producer("p", m.address) as p:
        for i in range(n):
            p.send(Message(topic, f"m{i}-".encode() + b"x" * 300, queue_id=0))


def readable(b, topic="Seeded") -> Counter:
    with PullConsumer(b.address, require_master=False) as c:
        return Counter(m.body[:8].decode().split("-")[0] for m in c.read_all(topic))


def in_sync(m, s):
    return lambda: info(s).local_durable_offset == info(m).log_end_offset and any(
        x.in_sync for x in info(m).replication.slaves)


def flip(path: str, at: float = 0.5) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(int(size * at))
        b = f.read(1)
        f.seek(int(size * at))
        f.write(bytes([b[0] ^ 0x40]))


def slave_flags(s):
    return s.extra_args


@pytest.mark.parametrize("damage", ["table file", "manifest"])
def test_a_slave_whose_store_is_damaged_is_seeded_from_its_master_and_serves_nothing_damaged(broker_factory, damage):
    m, s = sync_pair(broker_factory, "--slave-read-enable", "--scrub-interval-ms", "200")
    fill(m)
    wait_until(in_sync(m, s), what="the slave in sync")
    s.stop()  # a clean stop leaves the store in table files
    target = {"table file": max(glob.glob(f"{s.data_dir}/*.sst"), key=os.path.getsize),
              "manifest": max(glob.glob(f"{s.data_dir}/MANIFEST-*"), key=os.path.getsize)}[damage]
    flip(target)
    if damage == "manifest":
        s.start()  # found at the open: the store is set aside and seeded before the broker serves
    else:
        # found by the scrub soon after the open: 200 ms in, which may come before or after the
        # broker reports ready, so either way of stopping with the damaged-store code is right
        try:
            s.start()
        except AssertionError as refused:
            assert f"exited with {EXIT_STORE_DAMAGED}" in str(refused), refused
        assert s.proc.wait(30) == EXIT_STORE_DAMAGED, s.log()[-2000:]
        assert "the store is damaged" in s.log()
        s.start()
    wait_until(in_sync(m, s), 30, what="the seeded slave in sync")
    assert "store seeded from master" in s.log()
    every = Counter({f"m{i}": 1 for i in range(400)})
    assert readable(m) == every
    wait_until(lambda: readable(s) == every, what="the seeded slave to serve the master's log (as published)")
    assert os.path.isdir(os.path.join(s.data_dir, ".damaged"))  # the damaged store, kept aside


def damage_only_a_compaction_meets(data_dir) -> None:
    """Four table files of the same keys, so that the next open compacts them and reads every block,
    the first of them damaged (before a fourth exists, so no compaction has read it yet); in
    RocksDB's default family, which the broker never reads."""
    for n in range(4):
        db = open_database(str(data_dir))
        for i in range(3000):
            db.db.put(f"pad{i:05d}".encode(), os.urandom(200))
        try:
            db.close()
        except Exception as e:  # noqa: BLE001 - the fourth file's flush began the compaction, which met it
            if n < 3 or "Corruption" not in str(e):
                raise
        if n == 0:
            flip(max(glob.glob(f"{data_dir}/*.sst"), key=os.path.getsize), at=0.33)


def write_until_stopped(m, b) -> None:
    """Send to master `m` until broker `b` has exited (a send may fail meanwhile: its slave gone)."""
    with Producer("p", m.address, request_timeout=2) as p:
        def stopped():
            try:
                p.send(Message("Seeded", b"late-"))
            except ClientError:
                pass
            return b.proc.poll() is not None
        wait_until(stopped, 30, what=f"{b.data_dir.name}'s broker stopping at a write RocksDB refuses")


def test_a_slave_whose_writes_stop_on_a_damaged_file_is_seeded_from_its_master(broker_factory):
    """The fault harness, seed 443: a damaged table file that neither the open nor a read met, but a
    compaction did. RocksDB then refuses every write ("Corruption"); the slave stopped as for any
    failed write, met the same damage at each of its 119 starts and never came back, so its group
    of two had no slave to promote or to hold SYNC writes. A write refused for damage is damage: the
    store is marked, and the next start seeds it from the master."""
    m, s = sync_pair(broker_factory, "--slave-read-enable", "--scrub-interval-ms", "0")
    fill(m)
    wait_until(in_sync(m, s), what="the slave in sync")
    s.stop()
    damage_only_a_compaction_meets(s.data_dir)
    try:
        s.start()  # the compaction fails soon after the open, before or after the broker is ready
    except AssertionError as refused:
        assert f"exited with {EXIT_STORE_DAMAGED}" in str(refused), refused
    write_until_stopped(m, s)  # once the compaction has failed, the slave's next replicated write stops it
    assert s.proc.wait(30) == EXIT_STORE_DAMAGED, s.log()[-2000:]
    s.start()  # the kubelet's restart
    wait_until(in_sync(m, s), 30, what="the seeded slave in sync")
    assert "store seeded from master" in s.log()
    fill(m, 10, "After")
    wait_until(lambda: readable(s, "After") == Counter({f"m{i}": 1 for i in range(10)}), what="live replication")


def test_a_master_whose_writes_stop_on_a_damaged_file_stops_for_its_failover(broker_factory):
    """The same damage on a master: it stops as damaged (not as a failed write, to meet the same files
    again), and will not lead from that store again: it must start as a slave, to be seeded."""
    m = broker_factory(*SYNC_FLAGS, "--replication-mode", "ASYNC", "--scrub-interval-ms", "0", name="m")
    fill(m, 50)
    m.stop()
    damage_only_a_compaction_meets(m.data_dir)
    try:
        m.start()
    except AssertionError as refused:
        assert f"exited with {EXIT_STORE_DAMAGED}" in str(refused), refused
    else:
        write_until_stopped(m, m)
        assert m.proc.returncode == EXIT_STORE_DAMAGED, m.log()[-2000:]
    with pytest.raises(AssertionError, match="exited with 2"):
        m.start()
    assert "needs seeding from a master" in m.log() and "start it as a slave" in m.log(), m.log()[-2000:]


def test_a_restarted_master_on_probation_still_seeds_its_damaged_slave(broker_factory):
    """A restarted SYNC master takes no write until a slave shows its log whole (seed 450); a slave
    whose store is damaged must first seed itself from that master. Both restarted together (a
    group's power cut), each would wait for the other for good unless the seed is served."""
    m, s = sync_pair(broker_factory, "--slave-read-enable")
    fill(m)
    wait_until(in_sync(m, s), what="the slave in sync")
    s.stop()
    flip(max(glob.glob(f"{s.data_dir}/MANIFEST-*"), key=os.path.getsize))
    m.stop()
    m.start()  # on probation: no slave has shown it this log is whole
    with Producer("p", m.address, request_timeout=2) as p, pytest.raises(BrokerError, match="lost nothing"):
        p.send(Message("Seeded", b"too early"))
    s.start()  # found at the open: seeded from the master on probation, then it subscribes
    wait_until(in_sync(m, s), 30, what="the seeded slave in sync")
    assert "store seeded from master" in s.log()
    fill(m, 10, "After")
    wait_until(lambda: readable(s, "After") == Counter({f"m{i}": 1 for i in range(10)}), what="live replication")


def test_a_slave_that_needs_records_its_master_deleted_is_seeded(broker_factory, tmp_path):
    m = broker_factory(*SYNC_FLAGS, "--replication-mode", "ASYNC", "--retention-ms", "300",
                       "--retention-check-interval-ms", "100", "--broker-name", "m", name="m")
    fill(m, 200)
    end = info(m).log_end_offset
    wait_until(lambda: info(m).log_start_offset > end, what="retention past the first records")
    s = BrokerProcess(tmp_path / "s-data", tmp_path / "s.log", ["--role", "slave", "--master", m.address,
                                                                "--broker-name", "s", "--slave-read-enable",
                                                                *SYNC_FLAGS, "--replication-mode", "ASYNC"])
    try:
        # refused: the master deleted what it needs; it stops, its store marked for a seed
        assert s.start_until_exit() == EXIT_RESEED, s.log()[-2000:]
        assert "must be seeded from a copy of the master's store" in s.log()
        s.start()  # the kubelet's restart
        wait_until(in_sync(m, s), 30, what="the seeded slave in sync")
        fill(m, 10, "After")
        wait_until(lambda: readable(s, "After") == Counter({f"m{i}": 1 for i in range(10)}), what="live replication")
    finally:
        s.stop()


def test_a_snapshot_request_names_only_its_own_files(broker_factory):
    m, _s = sync_pair(broker_factory)

    async def ask(req: SnapshotRequest):
        c = BrokerClient([m.address])
        try:
            return await c.request(RequestCode.REPLICATION_SNAPSHOT, req, SnapshotResponse)
        finally:
            await c.close()

    import asyncio

    begun = asyncio.run(ask(SnapshotRequest("begin")))
    assert begun.files and begun.last_lsn >= 1
    for bad in ("../../etc/passwd", "/etc/passwd", "RESEED"):
        with pytest.raises(BrokerError) as e:
            asyncio.run(ask(SnapshotRequest("read", begun.snapshot_id, bad, 0, 10)))
        assert e.value.code_name == "MESSAGE_ILLEGAL" and "has no file" in e.value.remark
    name, size = begun.files[0]
    with pytest.raises(BrokerError) as e:
        asyncio.run(ask(SnapshotRequest("read", begun.snapshot_id, name, 0, 64 << 20)))
    assert "at most" in e.value.remark
    assert asyncio.run(ask(SnapshotRequest("end", begun.snapshot_id))).snapshot_id == begun.snapshot_id
    with pytest.raises(BrokerError) as e:
        asyncio.run(ask(SnapshotRequest("read", begun.snapshot_id, name, 0, 10)))
    assert e.value.code_name == "QUERY_NOT_FOUND"
    assert not os.path.exists(os.path.join(m.data_dir, ".snapshots", begun.snapshot_id))
    assert metric(m, "txbroker_store_damaged_total") == 0


def test_a_copy_of_a_masters_damaged_table_file_is_found_before_a_slave_installs_it(broker_factory, tmp_path):
    """The seed side of the fault harness's seed 571: a master's table file damaged under the blocks
    its cache held was copied to a slave that needed a seed, installed, found damaged at the slave's
    open, and copied again at each start. The slave reads the copy back before installing it: it
    refuses it, naming the master's damaged file, and the master goes on serving (its own scrub or
    reads find the damage; an operator fails it over)."""
    m = broker_factory(*SYNC_FLAGS, "--replication-mode", "ASYNC", "--retention-ms", "300", "--scrub-interval-ms", "0",
                       "--retention-check-interval-ms", "100", "--broker-name", "m", name="m")
    fill(m, 2000)
    end = info(m).log_end_offset
    wait_until(lambda: info(m).log_start_offset > end, what="retention past the first records")
    first = BrokerProcess(tmp_path / "s1-data", tmp_path / "s1.log", ["--role", "slave", "--master", m.address,
                                                                       "--broker-name", "s1", *SYNC_FLAGS,
                                                                       "--replication-mode", "ASYNC"])
    assert first.start_until_exit() == EXIT_RESEED, first.log()[-2000:]
    first.start()  # seeded: the master's checkpoint wrote its memtables to table files
    first.stop()
    table = max(m.data_dir.glob("*.sst"), key=lambda p: p.stat().st_size)
    flip(str(table), 0.3)  # a failing disk, under a master that reads nothing of it
    s2 = BrokerProcess(tmp_path / "s2-data", tmp_path / "s2.log", ["--role", "slave", "--master", m.address,
                                                                    "--broker-name", "s2", *SYNC_FLAGS,
                                                                    "--replication-mode", "ASYNC"])
    assert s2.start_until_exit() == EXIT_RESEED, s2.log()[-2000:]  # needs a seed
    assert s2.start_until_exit() == 3, s2.log()[-2000:]
    said = s2.log()[-4000:]
    assert f"copy of master {m.address}'s store is damaged, so it was not installed" in said and table.name in said, said
    assert m.proc.poll() is None and info(m).role == "master"
