"""Properties every message of a half send carries, sent once (SEND_MESSAGE_SHARED, as a Spark
task sends its job, partition and attempt), with real brokers:

- a job's member sent so is read back, from the master and from its slave, with each message
  holding the shared properties under its own, and the broker counts the requests under the new
  code (`txbroker_request_latency_seconds{request="SEND_MESSAGE_SHARED"}`);
- a broker of the previous release refuses the code, and the session sends the messages each with
  its properties instead: nothing is stored without them.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request

from support.previous import PreviousBroker
from support.waiting import wait_until
from txbroker.client import AsyncTransactionProducer, JobCoordinator, LocalTransactionState as S, Message, PullConsumer
from txbroker.client.admin import AdminClient

SHARED = {"txbroker.spark.job": "job-7", "txbroker.spark.attempt": "3"}


def members() -> list[Message]:
    return [Message("Orders", b"plain", keys="o-1"),
            Message("Orders", b"own", keys="o-2", properties={"txbroker.spark.attempt": "mine", "extra": "x"})]


def expected(body: bytes) -> dict[str, str]:
    return {**SHARED, "txbroker.spark.attempt": "mine", "extra": "x"} if body == b"own" else dict(SHARED)


def carried(msgs) -> dict[bytes, dict[str, str]]:
    """Each body's properties as read, limited to the ones this test sent."""
    return {m.body: {k: v for k, v in m.properties.items() if k in SHARED or k == "extra"} for m in msgs}


def shared_requests(b) -> float:
    with urllib.request.urlopen(b.admin_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r'^txbroker_request_latency_seconds_count\{request="SEND_MESSAGE_SHARED"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_members_messages_carry_properties_sent_once_on_master_and_slave(broker_factory):
    master = broker_factory("--check-interval-ms", "600000", name="master")
    slave = broker_factory("--role", "slave", "--master", master.address, name="slave")
    admin = AdminClient(master.admin_url)
    wait_until(lambda: admin.broker_info().replication.slaves, what="the slave to subscribe")
    AdminClient(master.admin_url).create_topic("Orders", 2)

    jobs = JobCoordinator("spark-pg", master.address)
    try:
        job = jobs.open(timeout=60)
        jobs.send(job.job_id, members(), "member-0", properties=SHARED)
        jobs.commit(job.job_id, ["member-0"])
    finally:
        jobs.close()
    assert shared_requests(master) == 1

    want = {b"plain": expected(b"plain"), b"own": expected(b"own")}
    for b in (master, slave):
        reader = PullConsumer(b.address)
        try:
            got = wait_until(lambda: len(msgs := reader.read_all("Orders")) == 2 and msgs, what=f"the member on {b.address}")
        finally:
            reader.shutdown()
        assert carried(got) == want, b.address


def test_an_older_broker_refuses_the_code_and_gets_each_message_with_its_properties(tmp_path, caplog):
    old = PreviousBroker(tmp_path / "old-data", tmp_path / "old.log", ["--check-interval-ms", "600000"]).start()
    try:
        AdminClient(old.admin_url).create_topic("Orders", 1)

        async def go():
            async with AsyncTransactionProducer("orders-pg", old.address, None) as p:
                for txid in ("tx-1", "tx-2"):  # the second goes straight to SEND_MESSAGE
                    await p.session.prepare(members(), txid, properties=SHARED)
                    await p.end(txid, S.COMMIT)

        with caplog.at_level("INFO", logger="txbroker.client.transaction_session"):
            asyncio.run(go())
        assert sum("does not take shared properties" in r.getMessage() for r in caplog.records) == 1

        reader = PullConsumer(old.address)
        try:
            got = wait_until(lambda: len(msgs := reader.read_all("Orders")) == 4 and msgs, what="both transactions")
        finally:
            reader.shutdown()
        assert sorted((m.body, tuple(sorted(carried([m])[m.body].items()))) for m in got) == sorted(
            (body, tuple(sorted(expected(body).items()))) for body in (b"plain", b"own", b"plain", b"own"))
    finally:
        old.stop()
