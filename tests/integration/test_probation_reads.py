"""A restarted SYNC-replication master whose log came back without a tail its slave holds answers no
read until a slave shows it what it lacks (seed 450's class, found by a review of its fix).

The review found probation refusing writes and offset queries, but a pull under
`--slave-read-enable`, QUERY_JOB (a coordinator's describe), a view by id, a search by time and a
query by key were still answered from the shorter log: a job read OPEN that had been read COMMITTED,
a queue ending before a message its producer was told is stored. A lost tail is made here by
putting back a copy of the master's store taken before the tail was written, as a write-ahead log
cut short recovers."""

from __future__ import annotations

import shutil

import pytest

from support.pairs import cut_tail, sync_pair
from support.waiting import wait_until
from txbroker.client import BrokerError, JobCoordinator, Message, Producer, PullConsumer
from txbroker.client.admin import AdminClient


def info(b):
    return AdminClient(b.admin_url).get("/api/v1/broker")


def in_sync(m, s):
    return lambda: info(s)["local_durable_offset"] == info(m)["log_end_offset"] and any(
        x["in_sync"] for x in info(m)["replication"]["slaves"])


def test_a_master_that_lost_a_tail_its_slave_holds_answers_no_read_until_the_slave_returns(broker_factory, tmp_path):
    m, s = sync_pair(broker_factory, "--slave-read-enable")
    with Producer("p", m.address) as p:
        p.send(Message("Q", b"before", queue_id=0, keys="k"))
    with JobCoordinator("jg", m.address) as c:
        job = c.open(timeout=600)
        member = c.send(job.job_id, Message("J", b"member"))
    wait_until(in_sync(m, s), what="the slave in sync")
    s.stop()
    m.stop()
    shutil.copytree(m.data_dir, tmp_path / "before-the-tail")
    m.start()
    s.start()
    wait_until(lambda: not info(m)["probation"], what="probation to end")
    # the tail: acknowledged under SYNC flush and replication, so the slave holds each
    with Producer("p", m.address) as p:
        after = p.send(Message("Q", b"after", queue_id=0, keys="k"))
    with JobCoordinator("jg", m.address) as c:
        assert c.commit(job.job_id, [member]).state == "COMMITTED"
    wait_until(in_sync(m, s), what="the slave in sync")
    s.stop()
    cut_tail(m, tmp_path / "before-the-tail")
    m.start()
    assert info(m)["probation"]
    with PullConsumer(m.address, request_timeout=3) as c:
        for read in (lambda: c.pull("Q", 0, 0), lambda: c.view(after.msg_id),
                     lambda: c.search_offset("Q", 0, 2**62), lambda: c.find_by_key("Q", "k")):
            with pytest.raises(BrokerError, match="lost nothing"):
                read()
    with JobCoordinator("jg", m.address, request_timeout=3) as c, pytest.raises(BrokerError, match="lost nothing"):
        c.describe(job.job_id)
    s.start()  # its log shows the master lost a tail: the master steps down, for its slave's promotion
    wait_until(lambda: info(m)["stepped_down"], what="the master to step down")
