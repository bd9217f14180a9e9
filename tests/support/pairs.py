"""A SYNC master and its one slave (real brokers), the slave in sync: the smallest setup where a
write can be stored on the master and not yet acknowledged by a slave (pause the slave)."""

from __future__ import annotations

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
