"""A broker whose disk fills (issue 23, suspected defect: are requests of a failed write answered
SUCCESS?): it stops (exit 70) rather than run ahead of its disk, answers no request of the failed
write SUCCESS, and everything it did acknowledge is there when it starts again with room."""

import asyncio
import shutil
import subprocess

import pytest

from support import txload
from support.cli import run_cli
from support.waiting import wait_until
from txbroker.client import BrokerError, BrokerUnavailable, Message, Producer, RequestTimeout
from txbroker.client.admin import AdminClient
from txbroker.store.records import HalfRecord
from txbroker.store.state import StateMachine

EXIT_STORE_FAILED = 70
SYNC_PAIR = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC")


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB filesystem of the test's own (tmpfs), unmounted afterwards."""
    where = tmp_path / "small"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here (needs root): {r.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_full_disk_stops_the_broker_and_loses_nothing_acknowledged(broker_factory, small_disk, tmp_path):
    b = broker_factory("--flush-disk-type", "SYNC", name="full")
    b.stop()
    b.data_dir = small_disk / "data"
    b.start()
    acked, refused = [], []
    body = b"x" * 60_000
    with Producer("g", b.address, request_timeout=5) as p:
        for i in range(2_000):
            try:
                p.send(Message("Fill", body + str(i).encode()))
                acked.append(i)
            except (BrokerError, BrokerUnavailable, RequestTimeout) as e:
                refused.append((i, str(e)))
                if b.proc.poll() is not None or len(refused) > 20:
                    break
    assert refused, "the disk never filled"
    assert b.proc.wait(30) == EXIT_STORE_FAILED
    assert "RocksDB write failed" in b.log()
    # More room: the same data on a larger disk.
    roomy = tmp_path / "roomy"
    shutil.copytree(small_disk / "data", roomy)
    b.data_dir = roomy
    b.start()
    seen = txload.visible(b.address, "Fill")
    kept = {int(text[len(body):]) for text in seen}
    assert set(acked) <= kept, f"acknowledged and lost: {sorted(set(acked) - kept)[:5]}"


def test_no_retried_request_is_answered_success_after_a_failed_write(tmp_path):
    """After the write of a batch fails, a retry of a request that batch held (a duplicate half send
    or END) finds nothing durable: it must not answer SUCCESS."""

    class DiskFull(OSError):
        pass

    async def main():
        fatal = []
        s = StateMachine(str(tmp_path), True, fatal.append)
        lsn, durable = s.append(HalfRecord("t1", "g", 1, [Message("T", b"a")]))

        class Full:
            def write(self, *_a):
                raise DiskFull("No space left on device")

        s._writer._db = Full()  # the disk fails under the group commit
        with pytest.raises(DiskFull):
            await durable
        assert fatal, "the broker was not told to stop"
        with pytest.raises(Exception) as e:
            fut = s.published_future(lsn)
            if fut is not None:
                await fut
        assert "failed write" in str(e.value)
        s.db.close()  # as the stopping broker leaves it: no drain after a failed write

    asyncio.run(main())


def test_a_backup_on_a_full_disk_is_refused_naming_it(broker_factory, small_disk, tmp_path):
    """The fault harness, seed 282 (at 774c133): a backup asked of a slave whose disk had just filled
    answered HTTP 500 "Server got itself in trouble": the checkpoint's IO error was not caught. It
    is refused naming the full disk, and leaves no backup behind."""
    m = broker_factory(*SYNC_PAIR, "--broker-name", "m", name="m")
    s = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s", *SYNC_PAIR, name="s")
    s.stop()
    s.data_dir = small_disk / "data"
    s.start()
    wait_until(lambda: any(x["in_sync"] for x in AdminClient(m.admin_url).get("/api/v1/broker")["replication"]["slaves"]),
               what="the slave in sync")
    with Producer("g", m.address) as p:
        for i in range(50):
            p.send(Message("Kept", f"m{i}".encode()))
    filler = small_disk / "filler"
    with open(filler, "wb") as f:   # the disk fills under the idle slave
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    r = run_cli("backup", "create", "--admin", s.admin_url, "--to", str(tmp_path / "backup"), check=False)
    assert r.returncode == 1, r
    said = r.stderr.strip().splitlines()[-1]
    assert "(NO_SPACE)" in said and "No space left on device" in said, said
    assert not (tmp_path / "backup" / "backup.json").exists()
    filler.unlink()
    assert not list((small_disk / "data" / ".snapshots").glob("backup-*")), "a half checkpoint was left"


def test_a_master_whose_disk_fills_exits_even_when_stopping_would_write_its_slave_record(broker_factory, small_disk):
    """Chaos seed 777 (ASYNC): the master's write failed on a full disk, and stopping it detached its
    two in-sync slaves; the first one's leaving made the other hold everything, so the slave record
    was saved, on the same full disk. That raised inside Broker.stop: the broker never exited, never
    restarted, and answered 503 to the end. It must exit (70) and come back."""
    flags = ("--replication-mode", "ASYNC", "--flush-disk-type", "ASYNC")
    m = broker_factory(*flags, "--broker-name", "m", name="m")
    m.stop()
    m.data_dir = small_disk / "data"
    m.start()
    for n in ("s1", "s2"):
        broker_factory("--role", "slave", "--master", m.address, "--broker-name", n, *flags, name=n)
    wait_until(lambda: sum(x["in_sync"] for x in AdminClient(m.admin_url).get("/api/v1/broker")["replication"]["slaves"])
               == 2, what="both slaves in sync", timeout=60)
    body = b"x" * 60_000
    with Producer("g", m.address, request_timeout=5) as p:
        for i in range(2_000):
            try:
                p.send(Message("Fill", body + str(i).encode()))
            except (BrokerError, BrokerUnavailable, RequestTimeout):
                break
    assert m.proc.wait(30) == EXIT_STORE_FAILED
    assert "RocksDB write failed" in m.log()
