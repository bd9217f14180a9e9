"""A SYNC master and its one slave (real brokers), the slave in sync: the smallest setup where a
write can be stored on the master and not yet acknowledged by a slave (pause the slave)."""

from __future__ import annotations

import shutil

from support.waiting import wait_until
from txbroker.client.admin import AdminClient

SYNC_FLAGS = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-timeout-ms", "300",
              "--replication-heartbeat-ms", "100")


def sync_pair(broker_factory, *extra: str):
    """(master, slave), started with SYNC_FLAGS and `extra`, once the slave is in sync."""
    m = broker_factory(*SYNC_FLAGS, *extra, "--broker-name", "m", name="m")
    s = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s", *SYNC_FLAGS, *extra, name="s")
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
