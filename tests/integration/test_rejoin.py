"""A broker that rejoins as a slave ends with exactly its master's log, and serves it (issue 23,
defects 3 and 4): records it held that the master never had are truncated, whichever epochs wrote
them, and nothing truncated is served again from memory."""

import signal
from collections import Counter

from support.waiting import wait_until
from txbroker.client import Message, Producer, PullConsumer
from txbroker.client.admin import AdminClient

COMMON = ("--slave-read-enable", "--check-interval-ms", "60000")


def info(b):
    return AdminClient(b.admin_url).get("/api/v1/broker")


def role(b, **body):
    AdminClient(b.admin_url).post("/api/v1/role", body)


def send(b, topic, *bodies):
    with Producer("p", b.address) as p:
        for body in bodies:
            p.send(Message(topic, body.encode()))


def readable(b, topic) -> Counter:
    with PullConsumer(b.address, require_master=False) as c:
        return Counter(m.body.decode() for m in c.read_all(topic))


def caught_up(slave, master):
    return lambda: info(slave)["local_durable_offset"] == info(master)["log_end_offset"]


def serves_all_of(slave, master):
    """The slave has its master's whole log and may serve it: readers see up to what is published
    there, which follows the local write by a moment (CI saw the read come first). It replicates
    first: a rejoining master's own log may end at the same offset before it truncates (CI again)."""
    def check():
        i = info(slave)
        return (i["role"] == "slave" and i["replication"]["connected"]
                and i["durable_offset"] == info(master)["log_end_offset"])
    return check


def slave(factory, name, master):
    return factory("--role", "slave", "--master", master.address, "--broker-name", name, *COMMON, name=name)


def test_demoted_master_serves_the_new_masters_records_not_its_truncated_ones(broker_factory):
    """Defect 3: records read (and cached) on a master, then truncated when it rejoins as a slave,
    must not be served in place of the new master's records at the same positions."""
    a = broker_factory("--broker-name", "a", *COMMON, name="a")
    b = slave(broker_factory, "b", a)
    send(a, "Q", "shared")
    wait_until(caught_up(b, a), what="b to have the shared record")
    b.proc.send_signal(signal.SIGSTOP)
    send(a, "Q", "a-only-1", "a-only-2")
    assert readable(a, "Q") == Counter(["shared", "a-only-1", "a-only-2"])  # read, so in a's cache
    b.kill()  # b never had a's last records
    b.extra_args = ["--broker-name", "b", *COMMON]
    b.start()
    role(b, role="master", epoch=2)  # its epoch record takes the first position a wrote alone
    send(b, "Q", "b-new")
    role(a, role="slave", master=b.address, epoch=2)
    wait_until(serves_all_of(a, b), what="a to rejoin as b's slave, serving all of b's log")
    assert readable(b, "Q") == Counter(["shared", "b-new"])
    assert readable(a, "Q") == Counter(["shared", "b-new"]), "a serves records it truncated"


def test_rejoining_slave_truncates_records_of_an_epoch_the_master_never_had(broker_factory):
    """Defect 4: b led briefly at epoch 2 from a shorter log than c, which never saw epoch 2 and
    leads at 3. b's epoch-2 records sit at positions where c holds epoch-1 records, and b's log is
    not longer than c's: b must still truncate them (KIP-101/279), and end with c's log."""
    a = broker_factory("--broker-name", "a", *COMMON, name="a")
    b = slave(broker_factory, "b", a)
    c = slave(broker_factory, "c", a)
    send(a, "E", "e1-shared")
    wait_until(caught_up(b, a), what="b caught up")
    b.proc.send_signal(signal.SIGSTOP)
    send(a, "E", "e1-a", "e1-b", "e1-c")
    wait_until(caught_up(c, a), what="c to have every epoch-1 record")
    a.kill()
    b.kill()
    b.extra_args = ["--broker-name", "b", *COMMON]
    b.start()
    role(b, role="master", epoch=2)  # b leads without the last epoch-1 records (c is away, say)
    send(b, "E", "e2-b")
    b.kill()
    role(c, role="master", epoch=3)
    send(c, "E", *[f"e3-{i}" for i in range(6)])  # c's log is now longer than b's
    b.extra_args = ["--role", "slave", "--master", c.address, "--broker-name", "b", *COMMON]
    b.start()
    wait_until(serves_all_of(b, c), what="b to rejoin as c's slave, serving all of c's log")
    expected = Counter(["e1-shared", "e1-a", "e1-b", "e1-c"] + [f"e3-{i}" for i in range(6)])
    assert readable(c, "E") == expected
    assert readable(b, "E") == expected, "b keeps records its master never had"
