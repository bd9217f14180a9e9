"""Coordinated transactions (jobs, issue 17) against real brokers: the decision is a record in the
broker's log and the broker ends every member itself, with no END_TRANSACTION and no check-back."""

import asyncio
import shutil
import signal

import pytest

from support.cli import run_cli
from support.metrics import metric
from support.pairs import SHORT_ACK, restart_as_master, sync_pair, with_short_retention
from support.waiting import wait_until
from support import txload
from txbroker.client import (
    AsyncJobCoordinator, BrokerError, DecisionNotReplicated, JobCoordinator, Message, Producer, RequestTimeout,
)
from txbroker.client.admin import AdminClient, AdminError
from txbroker.protocol.codes import ResponseCode

GROUP = "jobs-pg"
FAST_CHECKS = ("--check-interval-ms", "200", "--transaction-timeout-ms", "100")


def bodies(address, topic="Orders"):
    return txload.visible(address, topic)


def tx_state(broker, txid):
    return AdminClient(broker.admin_url).get(f"/api/v1/transactions/{txid}")["state"]


def test_a_commit_makes_exactly_the_named_members_visible_and_rolls_back_the_rest(broker):
    with JobCoordinator(GROUP, broker.address) as c:
        job = c.open(timeout=60)
        assert job.state == "OPEN"
        kept = [c.send(job.job_id, [Message("Orders", f"o{i}".encode()), Message("Billing", f"b{i}".encode())])
                for i in range(3)]
        dropped = c.send(job.job_id, Message("Orders", b"from-a-discarded-attempt"))
        assert bodies(broker.address) == {}  # members are half messages until the decision
        decided = c.commit(job.job_id, kept)
        assert (decided.state, decided.members) == ("COMMITTED", 3)
        wait_until(lambda: c.describe(job.job_id).pending == 0, what="every member ended by the broker")
    assert bodies(broker.address) == {"o0": 1, "o1": 1, "o2": 1}
    assert bodies(broker.address, "Billing") == {"b0": 1, "b1": 1, "b2": 1}
    assert tx_state(broker, dropped) == "ROLLED_BACK"
    assert {AdminClient(broker.admin_url).get(f"/api/v1/transactions/{t}")["by"] for t in kept} == {"job"}
    assert metric(broker, "txbroker_job_members_resolved_total", outcome="commit") == 3
    assert metric(broker, "txbroker_jobs_decided_total", by="client", decision="commit") == 1


def test_the_first_decision_wins_and_a_late_opposite_one_is_refused_naming_it(broker):
    with JobCoordinator(GROUP, broker.address) as c:
        committed = c.open(timeout=60)
        t = c.send(committed.job_id, Message("Orders", b"kept"))
        c.commit(committed.job_id, [t])
        assert c.commit(committed.job_id, [t]).already  # a retried decision changes nothing
        with pytest.raises(BrokerError) as e:
            c.abort(committed.job_id)
        assert e.value.code == ResponseCode.TRANSACTION_SHOULD_COMMIT and "COMMITTED" in e.value.remark

        aborted = c.open(timeout=60)
        u = c.send(aborted.job_id, Message("Orders", b"never"))
        c.abort(aborted.job_id)
        with pytest.raises(BrokerError) as e:
            c.commit(aborted.job_id, [u])  # a zombie driver cannot commit after an abort
        assert e.value.code == ResponseCode.TRANSACTION_SHOULD_ROLLBACK and "ABORTED" in e.value.remark
        with pytest.raises(BrokerError) as e:
            c.send(aborted.job_id, Message("Orders", b"late member"))
        assert "ABORTED" in e.value.remark and "no new members" in e.value.remark
    wait_until(lambda: txload.settled(broker.admin_url), what="both jobs resolved")
    assert bodies(broker.address) == {"kept": 1}


def test_members_own_ends_agree_with_the_decision_or_are_refused(broker):
    from txbroker.client import LocalTransactionState
    from txbroker.client.transaction import AsyncTransactionProducer, TransactionListener

    async def main():
        async with AsyncJobCoordinator(GROUP, broker.address) as c, \
                AsyncTransactionProducer(GROUP, broker.address, TransactionListener()) as p:
            job = await c.open(timeout=60)
            a = await c.send(job.job_id, Message("Orders", b"a"))
            b = await c.send(job.job_id, Message("Orders", b"b"))
            with pytest.raises(BrokerError) as e:  # before the decision, the job decides
                await p.end(a, LocalTransactionState.COMMIT)
            assert e.value.code == ResponseCode.ILLEGAL_OPERATION and job.job_id in e.value.remark
            await c.commit(job.job_id, [a])
            r = await p.end(a, LocalTransactionState.COMMIT)  # the same as the decision: idempotent
            assert r.state == LocalTransactionState.COMMIT.value
            with pytest.raises(BrokerError) as e:
                await p.end(b, LocalTransactionState.COMMIT)
            assert e.value.code == ResponseCode.TRANSACTION_SHOULD_ROLLBACK

    asyncio.run(main())
    wait_until(lambda: txload.settled(broker.admin_url), what="the job resolved")
    assert bodies(broker.address) == {"a": 1}


def test_members_of_an_undecided_job_are_never_checked_back_and_the_deadline_aborts_them(broker_factory):
    b = broker_factory(*FAST_CHECKS)
    admin = AdminClient(b.admin_url)
    with JobCoordinator(GROUP, b.address) as c:
        job = c.open(timeout=2)
        members = [c.send(job.job_id, Message("Orders", f"m{i}".encode())) for i in range(5)]
        assert admin.post("/api/v1/check-scan")["checked"] == 0
        wait_until(lambda: c.describe(job.job_id).state == "ABORTED", 15, what="the broker to abort at the deadline")
        info = c.describe(job.job_id)
        assert info.by == "deadline"
        with pytest.raises(BrokerError) as e:  # the driver comes back too late
            c.commit(job.job_id, members)
        assert e.value.code == ResponseCode.TRANSACTION_SHOULD_ROLLBACK and "deadline" in e.value.remark
    wait_until(lambda: txload.settled(b.admin_url), what="the members rolled back")
    assert {tx_state(b, t) for t in members} == {"ROLLED_BACK"}
    assert all(admin.get(f"/api/v1/transactions/{t}")["checks"] == 0 for t in members)
    assert metric(b, "txbroker_checkbacks_sent_total") == 0
    assert metric(b, "txbroker_jobs_decided_total", by="deadline", decision="abort") == 1
    assert bodies(b.address) == {}


def test_bad_input_is_refused_clearly_and_changes_nothing(broker):
    admin = AdminClient(broker.admin_url)
    with JobCoordinator(GROUP, broker.address) as c, JobCoordinator("other-pg", broker.address) as other:
        job = c.open(timeout=60)
        mine = c.send(job.job_id, Message("Orders", b"mine"))
        second = c.open(timeout=60)
        elsewhere = c.send(second.job_id, Message("Orders", b"of the second job"))
        foreign = other.send(other.open(timeout=60).job_id, Message("Orders", b"another group"))

        def refused(call, code, *words):
            with pytest.raises(BrokerError) as e:
                call()
            assert e.value.code == code, e.value
            for w in words:
                assert w in e.value.remark, e.value.remark

        refused(lambda: c.commit("no-such-job.e1.5", [mine]), ResponseCode.QUERY_NOT_FOUND, "no-such-job.e1.5")
        refused(lambda: c.commit("bad id!", [mine]), ResponseCode.MESSAGE_ILLEGAL, "malformed job id")
        refused(lambda: c.commit(job.job_id, [mine, "never-sent"]), ResponseCode.QUERY_NOT_FOUND, "never-sent")
        refused(lambda: c.commit(job.job_id, [mine, elsewhere]), ResponseCode.ILLEGAL_OPERATION, second.job_id)
        refused(lambda: c.commit(job.job_id, [mine, foreign]), ResponseCode.ILLEGAL_OPERATION, "not a member")
        refused(lambda: other.commit(job.job_id, [mine]), ResponseCode.TRANSACTION_STATE_GROUP_WRONG, GROUP)
        refused(lambda: c.open(timeout=0.5), ResponseCode.MESSAGE_ILLEGAL, "out of range")
        refused(lambda: c.open(timeout=8 * 24 * 3600), ResponseCode.MESSAGE_ILLEGAL, "out of range")
        refused(lambda: c.open(timeout=60, name="bad name"), ResponseCode.MESSAGE_ILLEGAL, "malformed job name")
        refused(lambda: c.send("no-such-job.e1.5", Message("Orders", b"x")), ResponseCode.QUERY_NOT_FOUND)
        refused(lambda: other.send(job.job_id, Message("Orders", b"x")), ResponseCode.TRANSACTION_STATE_GROUP_WRONG)
        # nothing changed: the job is still open with its member pending, and nothing is visible
        info = c.describe(job.job_id)
        assert (info.state, info.pending) == ("OPEN", 1)
        assert admin.get(f"/api/v1/transactions/{foreign}")["state"] == "PREPARED"
        assert bodies(broker.address) == {}
        c.commit(job.job_id, [mine])
    wait_until(lambda: bodies(broker.address) == {"mine": 1}, what="the good decision to take effect")


def test_a_named_job_is_found_again_until_aborted(broker):
    with JobCoordinator(GROUP, broker.address) as c:
        first = c.open(timeout=60, name="nightly-2026-11-25")
        again = c.open(timeout=60, name="nightly-2026-11-25")
        assert again.job_id == first.job_id and again.already
        c.abort(first.job_id)
        fresh = c.open(timeout=60, name="nightly-2026-11-25")
        assert fresh.job_id != first.job_id and fresh.state == "OPEN"
        t = c.send(fresh.job_id, Message("Orders", b"rerun"))
        c.commit(fresh.job_id, [t])
        replay = c.open(timeout=60, name="nightly-2026-11-25")
        assert (replay.job_id, replay.state) == (fresh.job_id, "COMMITTED")  # a rerun sees it was published
        assert c.describe(name="nightly-2026-11-25").job_id == fresh.job_id


def test_prepare_fixes_the_members_and_commit_without_a_list_keeps_them(broker):
    with JobCoordinator(GROUP, broker.address) as c:
        job = c.open(timeout=60)
        ts = [c.send(job.job_id, Message("Orders", f"p{i}".encode())) for i in range(2)]
        extra = c.send(job.job_id, Message("Orders", b"speculative loser"))
        assert c.prepare(job.job_id, ts).state == "PREPARED"
        with pytest.raises(BrokerError) as e:
            c.send(job.job_id, Message("Orders", b"too late"))
        assert "PREPARED" in e.value.remark
        with pytest.raises(BrokerError):
            c.commit(job.job_id, [ts[0]])  # not the prepared list
        c.commit(job.job_id)
    wait_until(lambda: txload.settled(broker.admin_url), what="the job resolved")
    assert bodies(broker.address) == {"p0": 1, "p1": 1}
    assert tx_state(broker, extra) == "ROLLED_BACK"


def test_a_group_that_requires_jobs_refuses_lone_transactions(broker):
    from txbroker.client import LocalTransactionState, TransactionProducer
    from support.listeners import Decided

    AdminClient(broker.admin_url).put(f"/api/v1/groups/{GROUP}/transaction", {"require_job": True})
    with TransactionProducer(GROUP, broker.address, Decided(LocalTransactionState.COMMIT)) as p, pytest.raises(BrokerError) as e:
        p.send_message_in_transaction(Message("Orders", b"lone"))
    assert "requires every transaction to join a coordinated transaction" in e.value.remark
    with JobCoordinator(GROUP, broker.address) as c:
        job = c.open(timeout=60)
        c.commit(job.job_id, [c.send(job.job_id, Message("Orders", b"in a job"))])
    wait_until(lambda: bodies(broker.address) == {"in a job": 1}, what="the job's member visible")


async def send_members(c, job_id: str, n: int, body_prefix: str) -> list[str]:
    """n member transactions of one message each, 256 in flight."""
    sem = asyncio.Semaphore(256)

    async def one(i):
        async with sem:
            return await c.send(job_id, Message("Orders", f"{body_prefix}{i}".encode()), f"{job_id}-{i}")

    return await asyncio.gather(*(one(i) for i in range(n)))


def test_ten_thousand_members_become_visible_after_one_decision(broker):
    async def main():
        async with AsyncJobCoordinator(GROUP, broker.address) as c:
            job = await c.open(timeout=300)
            await c.commit(job.job_id, await send_members(c, job.job_id, 10_000, "m"))
            return job.job_id

    job_id = asyncio.run(main())
    with JobCoordinator(GROUP, broker.address) as c:
        wait_until(lambda: c.describe(job_id).pending == 0, 60, what="10,000 members ended")
    wait_until(lambda: txload.settled(broker.admin_url), what="published")
    seen = bodies(broker.address)
    assert len(seen) == 10_000 and set(seen.values()) == {1}


def test_after_failover_the_new_master_finishes_what_the_old_one_decided(broker_factory):
    flags = ("--replication-mode", "SYNC", "--flush-disk-type", "SYNC", "--replication-heartbeat-ms", "100")
    m = broker_factory(*flags, "--broker-name", "m", name="m")
    s, s2 = (broker_factory("--role", "slave", "--master", m.address, "--broker-name", n, *flags, name=n)
             for n in ("s", "s2"))
    wait_until(lambda: sum(x["in_sync"] for x in AdminClient(m.admin_url).get("/api/v1/broker")["replication"]
                           ["slaves"]) == 2, what="both slaves in sync")

    async def main():
        async with AsyncJobCoordinator(GROUP, [m.address, s.address]) as c:
            job = await c.open(timeout=300)
            txids = await send_members(c, job.job_id, 3000, "f")
            await c.commit(job.job_id, txids[:2500])  # acknowledged: the slave has the decision
            m.kill(signal.SIGKILL)  # while the broker is ending the members
            return job.job_id

    job_id = asyncio.run(main())
    # SYNC with one sync replica: the decision was acknowledged once a slave had it (either one);
    # the one that has it is promoted, as the operator promotes the slave in sync
    states = {x: AdminClient(x.admin_url).get(f"/api/v1/jobs/{job_id}")["state"] for x in (s, s2)}
    assert "COMMITTED" in states.values(), states
    s, s2 = (s, s2) if states[s] == "COMMITTED" else (s2, s)
    AdminClient(s.admin_url).post("/api/v1/role", {"role": "master", "epoch": 2})
    AdminClient(s2.admin_url).post("/api/v1/role", {"role": "slave", "master": s.address, "epoch": 2})
    wait_until(lambda: AdminClient(s.admin_url).get(f"/api/v1/jobs/{job_id}")["pending"] == 0, 30,
               what="the new master to end the remaining members")
    wait_until(lambda: txload.settled(s.admin_url), what="published on the new master")
    seen = bodies(s.address)
    assert set(seen) == {f"f{i}" for i in range(2500)} and set(seen.values()) == {1}


def test_a_master_that_starts_on_a_store_with_a_decision_and_unended_members_finishes_them(broker_factory, tmp_path):
    """The state a kill leaves between a decision and its members' ends, written through the
    store's own code (no broker running), then a real broker started on it."""
    from txbroker.protocol.bodies import Message as Msg
    from txbroker.protocol.codes import TransactionState
    from txbroker.store.records import EpochRecord, HalfRecord, JobDecisionRecord, JobOpenRecord, TopicRecord
    from txbroker.store.state import StateMachine

    data = tmp_path / "decided-store"

    async def write():
        st = StateMachine(str(data), True, lambda e: None)
        st.append(EpochRecord(1, "m", 1))
        st.append(TopicRecord("Orders", 1))
        st.append(JobOpenRecord("j.e1.2", GROUP, 1, 2**50))
        for i in range(4):
            st.append(HalfRecord(f"t{i}", GROUP, 1, [Msg("Orders", f"s{i}".encode(), queue_id=0)], "j.e1.2"))
        st.append(JobDecisionRecord("j.e1.2", int(TransactionState.COMMIT), 2, ["t0", "t1", "t2"]))
        await st.drain()
        await st.close()

    asyncio.run(write())
    b = broker_factory()
    b.stop()
    shutil.rmtree(b.data_dir)
    shutil.copytree(data, b.data_dir)
    b.start()
    with JobCoordinator(GROUP, b.address) as c:
        wait_until(lambda: c.describe("j.e1.2").pending == 0, 30, what="the broker to end the decided job's members")
    assert "finishing the members of 1 decided jobs" in b.log()
    assert bodies(b.address) == {"s0": 1, "s1": 1, "s2": 1}
    assert tx_state(b, "t3") == "ROLLED_BACK"


def test_the_cli_lists_shows_and_decides_jobs(broker):
    with JobCoordinator(GROUP, broker.address) as c:
        job = c.open(timeout=60)
        c.send(job.job_id, Message("Orders", b"via cli"))
    out = run_cli("job", "list", "--admin", broker.admin_url).stdout
    assert job.job_id in out and "OPEN" in out
    out = run_cli("job", "show", job.job_id, "--admin", broker.admin_url).stdout
    assert '"pending": 1' in out
    out = run_cli("job", "commit", job.job_id, "--admin", broker.admin_url).stdout
    assert "COMMITTED" in out
    wait_until(lambda: bodies(broker.address) == {"via cli": 1}, what="the member visible")
    bad = run_cli("job", "abort", job.job_id, "--admin", broker.admin_url, check=False)
    assert bad.returncode != 0 and "COMMITTED" in bad.stderr


def test_the_admin_api_refuses_to_end_a_member_behind_its_jobs_back(broker):
    with JobCoordinator(GROUP, broker.address) as c:
        job = c.open(timeout=60)
        t = c.send(job.job_id, Message("Orders", b"member"))
    with pytest.raises(AdminError) as e:
        AdminClient(broker.admin_url).post(f"/api/v1/transactions/{t}/commit")
    assert e.value.status == 409 and job.job_id in str(e.value)
    assert tx_state(broker, t) == "PREPARED"


def test_an_operators_decision_with_a_malformed_member_list_is_refused(broker):
    with JobCoordinator(GROUP, broker.address) as c:
        job = c.open(timeout=60)
        t = c.send(job.job_id, Message("Orders", b"kept by the operator"))
    admin = AdminClient(broker.admin_url)
    for body in ({"members": "not a list"}, {"members": [1, 2]}, [t, 3]):
        with pytest.raises(AdminError) as e:
            admin.post(f"/api/v1/jobs/{job.job_id}/commit", body)
        assert e.value.status == 400 and "members" in str(e.value)
    assert admin.get(f"/api/v1/jobs/{job.job_id}")["state"] == "OPEN"  # nothing changed
    assert admin.post(f"/api/v1/jobs/{job.job_id}/commit", {"members": [t]})["state"] == "COMMITTED"
    wait_until(lambda: bodies(broker.address) == {"kept by the operator": 1}, what="the kept member visible")


def test_a_decision_the_slave_lacks_yet_is_answered_once_it_has_it_not_refused(broker_factory):
    """The fault harness (seed 7, CI): a COMMIT the master stored while cut off from its slave was
    answered FLUSH_SLAVE_TIMEOUT, which the coordinator raised as a BrokerError, a refusal; the
    decision then reached the slave and its member became visible. Such an answer is not a refusal:
    the coordinator asks again until the slaves hold the decision, and answers it then."""
    m, s = sync_pair(broker_factory, ack_timeout_ms=SHORT_ACK)

    async def main():
        async with AsyncJobCoordinator(GROUP, m.address, request_timeout=20) as c:
            job = await c.open(timeout=60)
            kept = await c.send(job.job_id, Message("Orders", b"kept"))
            await c.send(job.job_id, Message("Orders", b"dropped"))
            s.proc.send_signal(signal.SIGSTOP)
            try:
                decision = asyncio.ensure_future(c.commit(job.job_id, [kept]))
                await asyncio.to_thread(
                    wait_until, lambda: metric(m, "txbroker_requests_rejected_total", code="FLUSH_SLAVE_TIMEOUT") >= 1,
                    what="the master to answer a write FLUSH_SLAVE_TIMEOUT")
                assert not decision.done(), decision
            finally:
                s.proc.send_signal(signal.SIGCONT)
            return await decision

    decided = asyncio.run(main())
    assert decided.state == "COMMITTED"
    wait_until(lambda: bodies(m.address) == {"kept": 1}, what="the kept member visible")


def test_a_decision_the_slave_never_got_in_time_is_unknown_not_refused(broker_factory):
    m, s = sync_pair(broker_factory, ack_timeout_ms=SHORT_ACK)
    with JobCoordinator(GROUP, m.address, request_timeout=2) as c:
        job = c.open(timeout=60)
        kept = c.send(job.job_id, Message("Orders", b"kept"))
        s.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(DecisionNotReplicated) as raised:
                c.commit(job.job_id, [kept])
        finally:
            s.proc.send_signal(signal.SIGCONT)
        assert isinstance(raised.value, RequestTimeout) and not isinstance(raised.value, BrokerError)
        assert job.job_id in str(raised.value) and "stored on the master" in str(raised.value), raised.value
        # what it may have done, it did: the slave got the decision once it ran again
        wait_until(lambda: c.describe(job.job_id).resolved, what="the decision replicated and its members ended")
        assert c.commit(job.job_id, [kept]).already
    assert bodies(m.address) == {"kept": 1}


def test_a_decision_waits_its_decision_timeout_for_a_slave_to_come_back(broker_factory):
    """Seen in CI: after a failover the heir's only slave is its old master, rejoining; the Spark
    driver's DECIDE_JOB gave up at the request timeout (30 s) and failed a job that committed once
    the slave was back. A decision is asked again for `decision_timeout`, not the request timeout."""
    m, s = sync_pair(broker_factory)
    unavailable = lambda: metric(m, "txbroker_requests_rejected_total", code="SLAVE_NOT_AVAILABLE")
    slaves = lambda: AdminClient(m.admin_url).get("/api/v1/broker")["replication"]["slaves"]

    async def main():
        async with AsyncJobCoordinator(GROUP, m.address, request_timeout=1, decision_timeout=120) as c:
            job = await c.open(timeout=300)
            kept = await c.send(job.job_id, Message("Orders", b"kept"))
            s.kill()
            await asyncio.to_thread(wait_until, lambda: not any(x["in_sync"] for x in slaves()),
                                    what="the master to see its slave gone")
            before = unavailable()
            decision = asyncio.ensure_future(c.commit(job.job_id, [kept]))
            # asked again past the request timeout (its backoff has reached 0.5 s by the sixth ask)
            await asyncio.to_thread(wait_until, lambda: unavailable() >= before + 10 or decision.done(),
                                    what="the master to refuse the decision ten times")
            assert not decision.done(), decision
            await asyncio.to_thread(s.start)
            return await decision

    decided = asyncio.run(main())
    assert decided.state == "COMMITTED"
    wait_until(lambda: bodies(m.address) == {"kept": 1}, what="the kept member visible")


def test_an_undecided_job_survives_retention_then_truncation_and_a_promotion(broker_factory):
    """Second review, defect 4: retention deleted an undecided job's open record (its marks kept
    only pending half records); a truncation after the old master rejoined derived the job again
    from that record on, found none and deleted it. After a promotion the job was gone (404, its
    name unknown) and its member stayed PREPARED past the deadline, forever (I4)."""
    m, s = sync_pair(broker_factory)
    with_short_retention(m, s)
    with JobCoordinator(GROUP, m.address, request_timeout=2) as c:
        job = c.open(timeout=15, name="nightly")
        member = c.send(job.job_id, Message("Orders", b"member"))
        end = AdminClient(m.admin_url).broker_info().log_end_offset
        for b in (m, s):  # retention on both passed the job's records
            with Producer("p", m.address) as p:
                p.send(Message("Filler", b"x"))
            wait_until(lambda b=b: AdminClient(b.admin_url).broker_info().log_start_offset > end,
                       what=f"retention on {b.address} past the job's records")
        s.kill()
        with pytest.raises(DecisionNotReplicated):  # a tail only the old master holds touches the job
            c.commit(job.job_id, [member])
    epoch = AdminClient(m.admin_url).broker_info().epoch
    m.kill()
    restart_as_master(s, epoch + 1)
    admin_s = AdminClient(s.admin_url)
    m.extra_args = [*m.extra_args, "--role", "slave", "--master", s.address]
    m.start()  # rejoins: truncates the decision it alone had
    wait_until(lambda: AdminClient(m.admin_url).broker_info().durable_offset == admin_s.broker_info().log_end_offset,
               what="the old master to rejoin and serve its new master's log")
    admin_s.post("/api/v1/role", {"role": "slave", "master": m.address, "epoch": epoch + 2})
    AdminClient(m.admin_url).post("/api/v1/role", {"role": "master", "epoch": epoch + 2})
    admin_m = AdminClient(m.admin_url)
    assert admin_m.get(f"/api/v1/jobs/{job.job_id}")["state"] == "OPEN"
    with JobCoordinator(GROUP, m.address) as c:
        assert c.describe(name="nightly").job_id == job.job_id
    wait_until(lambda: admin_m.get(f"/api/v1/jobs/{job.job_id}")["state"] == "ABORTED", 30,
               what="the deadline to abort the job on the master it ended on")
    wait_until(lambda: tx_state(m, member) == "ROLLED_BACK", what="its member rolled back (I4)")


def test_a_decision_no_slave_holds_is_not_reported_as_taken(broker_factory):
    """Second review, defect 1: with the only slave down, DECIDE_JOB ends in DecisionNotReplicated,
    which tells the caller to describe the job; QUERY_JOB then answered COMMITTED with resolved=true
    although no slave held the decision, so Spark's streaming commit took it for a replay and
    returned, and a failover then lost the batch. Every answer about a decision is the published one."""
    m, s = sync_pair(broker_factory)
    with JobCoordinator(GROUP, m.address, request_timeout=2) as c:
        job = c.open(timeout=60, name="batch-0007")
        kept = c.send(job.job_id, Message("Orders", b"kept"))
        s.kill()
        with pytest.raises(DecisionNotReplicated):
            c.commit(job.job_id, [kept])
        for seen in (c.describe(job.job_id), c.describe(name="batch-0007")):
            assert (seen.state, seen.resolved) == ("OPEN", False), seen
        assert '"state": "OPEN"' in run_cli("job", "show", job.job_id, "--admin", m.admin_url).stdout
        with pytest.raises(DecisionNotReplicated) as e:  # not refused naming a decision that may yet be lost
            c.abort(job.job_id)
        assert "COMMITTED" not in str(e.value), e.value
    # what the answers said is what a failover leaves: the slave never had the decision
    m.kill()
    restart_as_master(s, 2)
    assert AdminClient(s.admin_url).get(f"/api/v1/jobs/{job.job_id}")["state"] == "OPEN"


def test_a_decision_once_published_is_reported_with_its_members_ends(broker_factory):
    m, s = sync_pair(broker_factory, ack_timeout_ms=SHORT_ACK)
    with JobCoordinator(GROUP, m.address, request_timeout=2) as c:
        job = c.open(timeout=60)
        kept = c.send(job.job_id, Message("Orders", b"kept"))
        s.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(DecisionNotReplicated):
                c.commit(job.job_id, [kept])
            assert c.describe(job.job_id).state == "OPEN"
        finally:
            s.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: c.describe(job.job_id).resolved, what="the decision and the member's end published")
        assert c.describe(job.job_id).state == "COMMITTED"
    assert bodies(m.address) == {"kept": 1}


def test_a_committed_jobs_members_become_readable_in_one_step(broker):
    """Read whole (DESIGN, coordinated transactions): the broker ends a job's members slice by slice,
    so readers saw part of a committed job. While a committed job's members are being ended, each
    queue they go to is readable only up to where the first of them went (Kafka's last stable
    offset), until the last end is published: a reader sees none of the job, then all of it. ASYNC
    flush and no slave: nothing here waits on replication."""
    import threading

    from txbroker.client import PullConsumer

    n = 6_000  # six of the broker's resolution slices
    seen: list[int] = []
    stop = threading.Event()

    def watch():
        with PullConsumer(broker.address) as c:
            while not stop.is_set():
                seen.append(c.pull("Whole", 0, 0, 1).max_offset)

    async def main():
        async with AsyncJobCoordinator(GROUP, broker.address) as c:
            job = await c.open(timeout=300)
            sem = asyncio.Semaphore(256)

            async def one(i):
                async with sem:
                    return await c.send(job.job_id, Message("Whole", f"w{i}".encode(), queue_id=0), f"w-{i}")

            members = await asyncio.gather(*(one(i) for i in range(n)))
            t = threading.Thread(target=watch, daemon=True)
            t.start()
            await c.commit(job.job_id, members)
            while not (await c.describe(job.job_id)).resolved:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            stop.set()
            t.join(10)

    run_cli("topic", "create", "Whole", "--queues", "1", "--admin", broker.admin_url)
    asyncio.run(main())
    assert seen and set(seen) <= {0, n}, sorted(set(seen))[:10]
    assert seen[-1] == n


def test_a_prepared_job_has_its_own_longer_bound(broker_factory):
    """An OPEN job aborts at its deadline; a PREPARED one (deferred commit, an external coordinator)
    waits for its decision until its own bound, so a slow coordinator never loses prepared work to
    the OPEN deadline (Flink's KafkaSink loses it past Kafka's transaction timeout)."""
    import time

    b = broker_factory(*FAST_CHECKS)
    with JobCoordinator(GROUP, b.address) as c:
        job = c.open(timeout=1, prepared_timeout=4)
        t = c.send(job.job_id, Message("Orders", b"prepared"))
        prepared = c.prepare(job.job_id, [t])
        assert prepared.state == "PREPARED" and prepared.prepared_deadline_ms > job.deadline_ms + 2000
        wait_until(lambda: time.time() * 1000 > job.deadline_ms + 1000, what="the OPEN deadline to pass")
        assert c.describe(job.job_id).state == "PREPARED"  # kept past the OPEN deadline
        late = c.open(timeout=1, prepared_timeout=1)  # the same bound for a slow coordinator's other job
        c.prepare(late.job_id, [c.send(late.job_id, Message("Orders", b"too slow"))])
        wait_until(lambda: c.describe(late.job_id).state == "ABORTED", 15, what="the prepared bound to abort it")
        assert "prepared bound" in b.log()
        assert c.commit(job.job_id).state == "COMMITTED"  # within its bound: the decision still lands
    wait_until(lambda: bodies(b.address) == {"prepared": 1}, what="the prepared member visible")
