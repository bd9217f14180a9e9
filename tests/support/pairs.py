"""A SYNC master and its one slave (real brokers), the slave in sync: the smallest setup where a
write can be stored on the master and not yet acknowledged by a slave (pause the slave)."""

from __future__ import annotations

import shutil

from support.waiting import wait_until
from txbroker.client.admin import AdminClient

# How long a master waits for its slave's acknowledgement. A test that pauses the slave to see a
# write stored on the master only asks for the short wait (SHORT_ACK); every other test gets the
# broker's default, since a running slave on a loaded CI host can take longer than 0.3 s to answer
# (CI: a write of test_seed's fill answered FLUSH_SLAVE_TIMEOUT with the slave merely slow).
SHORT_ACK, DEFAULT_ACK = 300, 3_000

_SYNC = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-heartbeat-ms", "100")
SYNC_FLAGS = (*_SYNC, "--replication-timeout-ms", str(SHORT_ACK))


def sync_pair(broker_factory, *extra: str, ack_timeout_ms: int = DEFAULT_ACK):
    """(master, slave), started with SYNC replication and flush and `extra`, once the slave is in sync."""
    flags = (*_SYNC, "--replication-timeout-ms", str(ack_timeout_ms), *extra)
    m = broker_factory(*flags, "--broker-name", "m", name="m")
    s = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s", *flags, name="s")
    wait_until(lambda: any(x["in_sync"] for x in AdminClient(m.admin_url).get("/api/v1/broker")["replication"]["slaves"]),
               what="the slave in sync")
    return m, s


SHORT_RETENTION = ("--retention-ms", "300", "--retention-check-interval-ms", "100")


def with_short_retention(m, s) -> None:
    """Restart a pair from sync_pair with retention deleting records 0.3 s old. (Started so, the master
    deletes its first records before the slave subscribes, and must refuse it: it needs them.)"""
    for b in (s, m):
        b.extra_args = [*b.extra_args, *SHORT_RETENTION]
        b.restart()
    wait_until(lambda: any(x["in_sync"] for x in AdminClient(m.admin_url).get("/api/v1/broker")["replication"]["slaves"]),
               what="the slave in sync again")


def restart_as_master(s, epoch):
    """A killed slave started again (still a slave of its dead master) and promoted at `epoch`, as
    the operator does when the master died. Without short retention: a new master alone deletes
    what its returning old master needs within that time, and must then refuse it."""
    at = len(s.extra_args) - len(SHORT_RETENTION)
    if tuple(s.extra_args[at:]) == SHORT_RETENTION:
        s.extra_args = s.extra_args[:at]
    s.start()
    AdminClient(s.admin_url).post("/api/v1/role", {"role": "master", "epoch": epoch})


def cut_tail(b, copy) -> None:
    """Stop `b` and put back `copy` of its data directory, taken earlier: its log comes back without
    what it wrote since, as a write-ahead log cut short recovers (seed 450)."""
    b.stop()
    shutil.rmtree(b.data_dir)
    shutil.copytree(copy, b.data_dir)
