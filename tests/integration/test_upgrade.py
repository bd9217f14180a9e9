"""Upgrades between releases, with the previous release's real broker (support/previous.py: this
repository at a pinned commit, store format 4) beside the current one (issue 32, item 1):

- a store the previous release wrote (pending, parked and committed transactions, an undecided
  job, consumer offsets, retention's deletions) opens in the current broker, upgraded in place,
  with everything still there, and retention over it keeps what it must; after that the previous
  release refuses it with a message naming the path;
- a slave of the current release replicates from a master of the previous one (slaves are
  upgraded first); the other way round the master refuses it, in both logs and in
  /api/v1/broker's replication, and the old slave takes nothing (never diverges).
"""

from __future__ import annotations

import asyncio

from support.brokers import BrokerProcess
from support.previous import PREVIOUS_STORE_FORMAT, PREVIOUS_VERSION, PreviousBroker, run_previous_cli
from support.waiting import wait_until
from support import txload
from txbroker import __version__
from txbroker.client import (
    AsyncTransactionProducer, JobCoordinator, LocalTransactionState as S, Message, Producer, PullConsumer,
)
from txbroker.client.admin import AdminClient
from txbroker.store.records import STORE_FORMAT_VERSION

NO_CHECKS = ("--check-interval-ms", "600000")


def info(b) -> dict:
    return AdminClient(b.admin_url).get("/api/v1/broker")


def prepare(b, group: str, txid: str, body: bytes, topic: str = "Orders", **props: str) -> None:
    async def go():
        async with AsyncTransactionProducer(group, b.address, None) as p:
            await p.prepare([Message(topic, body, properties=props)], txid)
    asyncio.run(go())


def end(b, group: str, txid: str, state) -> None:
    async def go():
        async with AsyncTransactionProducer(group, b.address, None) as p:
            await p.end(txid, state)
    asyncio.run(go())


def transactions(b) -> dict[str, str]:
    return {t["transaction_id"]: t["state"] for t in AdminClient(b.admin_url).get("/api/v1/transactions")["transactions"]}


def test_a_store_of_the_previous_release_is_upgraded_in_place_and_then_refused_by_it(tmp_path):
    data = tmp_path / "data"
    old = PreviousBroker(data, tmp_path / "old.log", ["--retention-ms", "300", "--retention-check-interval-ms", "100",
                                                      *NO_CHECKS]).start()
    try:
        assert info(old)["version"] == PREVIOUS_VERSION and "store_format" not in info(old)
        AdminClient(old.admin_url).create_topic("Orders", 1)
        AdminClient(old.admin_url).create_topic("Plain", 1)
        # older than what retention deletes below: kept by its lineage, in format 4's terms
        prepare(old, "up-pg", "stays-pending", b"pending-body", CHECK_IMMUNITY_TIME_IN_SECONDS="36000")
        with Producer("p", old.address) as p:
            for i in range(20):
                p.send(Message("Plain", f"old-{i}".encode()))
        plain_end = info(old)["log_end_offset"]
        wait_until(lambda: info(old)["log_start_offset"] > plain_end, what="the old broker's retention to delete")
        old.extra_args[old.extra_args.index("--retention-ms") + 1] = "3600000"
        old.restart()
        # a group whose transactions are parked after one check, a committed transaction, an
        # undecided job with a member, and a consumer group's offset
        AdminClient(old.admin_url).put("/api/v1/groups/park-pg/transaction",
                                       {"check_max": 1, "timeout_ms": 1, "check_interval_ms": 200})
        prepare(old, "park-pg", "to-park", b"parked-body")
        prepare(old, "up-pg", "committed", b"committed-body")
        end(old, "up-pg", "committed", S.COMMIT)
        with JobCoordinator("job-pg", old.address) as c:
            job = c.open(timeout=3600)
            member = c.send(job.job_id, Message("Orders", b"job-body"))
        with PullConsumer(old.address) as c:
            c.commit_offsets("billing", {("Orders", 0): 1})
        wait_until(lambda: transactions(old).get("to-park") == "PARKED", what="the old broker to park to-park")
        before = info(old)
    finally:
        old.stop()

    new = BrokerProcess(data, tmp_path / "new.log", [*NO_CHECKS]).start()
    try:
        now = info(new)
        assert (now["version"], now["store_format"]) == (__version__, STORE_FORMAT_VERSION)
        assert f"store {data}: format {PREVIOUS_STORE_FORMAT} upgraded to {STORE_FORMAT_VERSION} in place" in new.log()
        # retention's deletions came along (an emptied queue's end did not survive even 0.1.0's own restart:
        # that release deleted a queue's newest message too, fixed since; no upgrade can bring it back)
        # the numbering goes on past the retained start: the previous release restarted it after the last
        # record left, below that start (test_retention's numbering test)
        assert before["log_end_offset"] < before["log_start_offset"] - 1
        assert (now["log_end_offset"], now["log_start_offset"]) == (before["log_start_offset"] - 1,
                                                                    before["log_start_offset"])
        assert transactions(new) == {"stays-pending": "PREPARED", "to-park": "PARKED", member: "PREPARED"}
        assert AdminClient(new.admin_url).job(job.job_id).state == "OPEN"
        assert txload.visible(new.address, "Orders") == {"committed-body": 1}
        with PullConsumer(new.address) as c:
            assert c.committed_offsets("billing", "Orders")[0] == {0: 1}

        # retention over the upgraded store keeps what format 4 wrote for the undecided ones
        new.extra_args[:] = ["--retention-ms", "300", "--retention-check-interval-ms", "100", *NO_CHECKS]
        new.restart()
        with Producer("p", new.address) as p:
            p.send(Message("Plain", b"after"))
        passed = info(new)["log_end_offset"]
        wait_until(lambda: info(new)["log_start_offset"] >= passed, what="retention after the upgrade")
        assert transactions(new) == {"stays-pending": "PREPARED", "to-park": "PARKED", member: "PREPARED"}
        new.extra_args[1] = "3600000"   # retention off again: what it deletes next would race the reads below
        new.restart()
        end(new, "up-pg", "stays-pending", S.COMMIT)
        AdminClient(new.admin_url).post("/api/v1/transactions/to-park/resume")
        end(new, "park-pg", "to-park", S.COMMIT)
        with JobCoordinator("job-pg", new.address) as c:
            c.commit(job.job_id, [member])
        decided = {"pending-body": 1, "parked-body": 1, "job-body": 1}

        def all_visible():
            seen = txload.visible(new.address, "Orders")
            return seen if decided.keys() <= seen.keys() else None
        seen = wait_until(all_visible, what="each undecided one, decided after the upgrade, visible")
        assert dict(seen) in (decided, {**decided, "committed-body": 1}), seen   # once each (retention may take that one)
    finally:
        new.stop()

    # the previous release refuses the upgraded store, naming it
    r = run_previous_cli("broker", "--data-dir", str(data), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
    assert r.returncode != 0
    assert f"data directory {data} has store format {STORE_FORMAT_VERSION}" in r.stderr + r.stdout


def test_a_new_slave_follows_an_old_master_and_an_old_slave_is_refused_by_a_new_master(tmp_path):
    flags = ["--replication-heartbeat-ms", "200", *NO_CHECKS]
    old = PreviousBroker(tmp_path / "a", tmp_path / "a.log", flags).start()
    new = BrokerProcess(tmp_path / "b", tmp_path / "b.log",
                        ["--role", "slave", "--master", old.address, "--broker-name", "b", *flags]).start()
    try:
        # slaves first: the new slave replicates the old master's records
        with Producer("p", old.address) as p:
            for i in range(10):
                p.send(Message("Orders", f"m{i}".encode()))
        wait_until(lambda: info(new)["log_end_offset"] == info(old)["log_end_offset"], what="the new slave caught up")
        rep = info(new)["replication"]
        assert rep["connected"] and rep["incompatible"] == "" and rep["master_version"] == ""   # 0.1.0 does not say
        assert [s["name"] for s in info(old)["replication"]["slaves"]] == ["b"]

        # mastership moves to the new broker; the old one, made its slave, is refused
        AdminClient(new.admin_url).change_role("master", 2)
        AdminClient(old.admin_url).change_role("slave", 2, new.address)
        wait_until(lambda: "CODE_40200" in info(old)["replication"]["last_error"], what="the old slave refused")
        old_rep, new_rep = info(old)["replication"], info(new)["replication"]
        assert f"cannot read the store format {STORE_FORMAT_VERSION} records" in old_rep["last_error"]
        assert "slave" in new_rep["incompatible"] and "before 0.2.0" in new_rep["incompatible"]
        assert new_rep["last_error"] == new_rep["incompatible"] and new_rep["slaves"] == []
        assert "refusing replication: slave" in new.log()
        assert "refused replication" in old.log() and "CODE_40200" in old.log()
        # it never diverges: the new master's writes do not reach it
        held = info(old)["log_end_offset"]
        with Producer("p", new.address) as p:
            p.send(Message("Orders", b"after-switch"))
        assert info(new)["log_end_offset"] > held == info(old)["log_end_offset"]
        assert not info(old)["replication"]["connected"]
    finally:
        old.stop()
        new.stop()
