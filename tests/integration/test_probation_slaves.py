"""Found by a review of cf5e2ec: probation ended at the first slave that subscribed and was not
ahead. With two slaves, the one behind could come back first: the master, its log cut short, then
acknowledged writes the other slave (holding the lost tail) never got, and stepped down when that
slave returned; a failover to it lost those writes. A master now records (durably) every slave
that may hold what it acknowledged, and its probation waits for each of them."""

import shutil

import pytest

from support.pairs import SYNC_FLAGS, cut_tail
from support.waiting import wait_until
from txbroker.client import Message, Producer, PullConsumer
from txbroker.client.admin import AdminClient, AdminError


def info(b):
    return AdminClient(b.admin_url).get("/api/v1/broker")


def in_sync(m, *slaves):
    return lambda: all(info(s)["local_durable_offset"] == info(m)["log_end_offset"] for s in slaves)


def bodies(b):
    with PullConsumer(b.address, require_master=False) as c:
        return [m.body.decode() for m in c.read_all("Q")]


def send(m, *names):
    with Producer("p", m.address) as p:
        for n in names:
            p.send(Message("Q", n.encode(), queue_id=0))


def subscribed(m, name):
    return lambda: any(x["name"] == name for x in info(m)["replication"]["slaves"])


def two_slaves_then_a_lost_tail(broker_factory, tmp_path):
    """m restarted with its log cut short: s1 (down) holds the tail m acknowledged and lost, s2
    (back) does not."""
    m = broker_factory(*SYNC_FLAGS, "--slave-read-enable", "--broker-name", "m", name="m")
    s1, s2 = (broker_factory("--role", "slave", "--master", m.address, "--broker-name", n, "--slave-read-enable",
                             *SYNC_FLAGS, name=n) for n in ("s1", "s2"))
    send(m, "a")
    wait_until(in_sync(m, s1, s2), what="both slaves in sync")
    assert info(m)["replication"]["recorded_slaves"] == ["s1", "s2"]
    s2.stop()  # s1 holds everything s2 had: s2 is forgotten, and m's restart waits for s1 alone
    wait_until(lambda: info(m)["replication"]["recorded_slaves"] == ["s1"], what="s2 forgotten")
    m.stop()
    shutil.copytree(m.data_dir, tmp_path / "before-the-tail")
    m.start()
    wait_until(lambda: not info(m)["probation"], what="s1 to end probation")
    send(m, "tail-1", "tail-2")  # acknowledged: s1 holds them, s2 is down
    wait_until(in_sync(m, s1), what="s1 to hold the tail")
    s1.stop()
    cut_tail(m, tmp_path / "before-the-tail")
    s2.start()
    m.start()
    wait_until(subscribed(m, "s2"), what="s2 (behind) subscribed")
    return m, s1, s2


def test_a_master_whose_log_lost_a_tail_acknowledges_nothing_the_slave_holding_that_tail_lacks(broker_factory, tmp_path):
    m, s1, _s2 = two_slaves_then_a_lost_tail(broker_factory, tmp_path)
    probation = info(m)["probation"]
    assert "waiting for slave(s) s1" in probation, probation
    with pytest.raises(Exception, match="lost nothing"):
        send(m, "new-1")
    s1.start()  # the slave holding the lost tail: the master steps down for it to be promoted
    wait_until(lambda: info(m)["stepped_down"], what="the master to step down")
    AdminClient(s1.admin_url).change_role("master", info(m)["epoch"] + 1)  # the operator's failover
    assert bodies(s1) == ["a", "tail-1", "tail-2"]  # everything acknowledged, nothing else


def test_a_slave_gone_for_good_is_forgotten_by_a_person_and_the_probation_ends(broker_factory, tmp_path):
    m, _s1, s2 = two_slaves_then_a_lost_tail(broker_factory, tmp_path)
    admin = AdminClient(m.admin_url)
    with pytest.raises(AdminError) as e:
        admin.forget_slave("s9")
    assert e.value.status == 404 and "recorded: s1, s2" in str(e.value), e.value
    with pytest.raises(AdminError) as e:  # s2 is subscribed: forgotten, it would hold writes no record names
        admin.forget_slave("s2")
    assert e.value.status == 409 and "subscribed" in str(e.value), e.value
    with pytest.raises(AdminError) as e:
        AdminClient(s2.admin_url).forget_slave("s1")
    assert e.value.status == 409, e.value
    after = admin.forget_slave("s1")  # its store lost: what only it held is lost with it
    assert after.probation == "" and after.replication.recorded_slaves == ["s2"], after
    send(m, "new-1")
    assert bodies(m) == ["a", "new-1"]


def test_a_slave_that_left_is_forgotten_when_another_comes_back_holding_all_it_was_sent(broker_factory):
    """Found by a review of 0fd9e60: a slave that left was forgotten only on another's next
    acknowledgement, so an idle master (or one on probation, which writes nothing) kept waiting
    for it after a slave holding everything it was sent had subscribed."""
    m = broker_factory(*SYNC_FLAGS, "--broker-name", "m", name="m")
    s1, s2 = (broker_factory("--role", "slave", "--master", m.address, "--broker-name", n, *SYNC_FLAGS, name=n)
              for n in ("s1", "s2"))
    send(m, "a")
    wait_until(in_sync(m, s1, s2), what="both slaves in sync")
    s1.stop()  # s2 holds all s1 had
    wait_until(lambda: info(m)["replication"]["recorded_slaves"] == ["s2"], what="s1 forgotten")
    s2.stop()  # no other slave: s2 stays recorded
    s1.start()  # holding everything s2 was sent (nothing was written since)
    wait_until(subscribed(m, "s1"), what="s1 back")
    assert info(m)["replication"]["recorded_slaves"] == ["s1"]
    m.restart()  # s2 gone for good: the restart waits for s1 alone
    wait_until(lambda: not info(m)["probation"], what="s1 to end the probation")
