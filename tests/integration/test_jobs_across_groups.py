"""Jobs that span broker groups, on real brokers (two groups, each a SYNC master and its slave, one
cluster file): one decision at the job's home, the members on the other group ending only as it
decided, whichever master is killed and whenever; read whole on each group; a deadline at the home
reaching every group; bad input refused naming what was wrong."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from support.cli import run_cli
from support.metrics import metric
from support.groups import FLAGS, start_cluster
from support.waiting import wait_until
from support import txload
from txbroker.client import (
    AsyncClusterJobCoordinator, AsyncJobCoordinator, BrokerError, ClusterJobCoordinator, JobCoordinator, Message,
)
from txbroker.client.admin import AdminClient

GROUP = "span-jobs-pg"


@pytest.fixture
def cluster(tmp_path):
    c = start_cluster(tmp_path)
    yield c
    c.stop()


def visible(c, topic="Out") -> dict:
    seen: dict[str, int] = {}
    for g in c.groups:
        try:
            for body, n in txload.visible(g.master.address, topic).items():
                seen[body] = seen.get(body, 0) + n
        except BrokerError as e:  # a group nothing was sent to has no such topic
            if e.code_name != "TOPIC_NOT_EXIST":
                raise
    return seen


def job_at(c, group: str, job_id: str) -> dict:
    return AdminClient(c.group(group).master.admin_url).get(f"/api/v1/jobs/{job_id}")


def test_a_job_spans_both_groups_and_commits_exactly_its_kept_members_everywhere(cluster):
    with ClusterJobCoordinator(GROUP, cluster.bootstrap) as c:
        job = c.open(timeout=60, name="nightly")
        assert set(job.all_groups) == {"g0", "g1"} and job.info.state == "OPEN"
        other = job.groups[0]
        kept = {job.home: [c.send(job, job.home, Message("Out", f"h{i}".encode())) for i in range(3)],
                other: [c.send(job, other, Message("Out", f"o{i}".encode())) for i in range(3)]}
        dropped = c.send(job, other, Message("Out", b"a discarded attempt"))
        assert visible(cluster) == {}
        decided_by = time.monotonic()
        info = c.commit(job, kept)
        assert info.state == "COMMITTED" and info.members == 3
        info = c.wait_resolved(job, 30)
        assert info.resolved and info.unresolved_groups == []
    assert visible(cluster) == {**{f"h{i}": 1 for i in range(3)}, **{f"o{i}": 1 for i in range(3)}}
    entry = job_at(cluster, other, job.job_id)  # the member group's entry follows its home
    assert (entry["state"], entry["home"], entry["by"]) == ("COMMITTED", job.home, "home")
    assert AdminClient(cluster.group(other).master.admin_url).transaction(dropped).state == "ROLLED_BACK"
    at_home = job_at(cluster, job.home, job.job_id)
    assert at_home["groups"] == [other] and at_home["resolved"]
    home_master = cluster.group(job.home).master  # the window a consumer of both groups could see half of it
    wait_until(lambda: metric(home_master, "txbroker_job_groups_visible_seconds_count") == 1,
               what="the home to count how long the job took to be visible everywhere")
    # the window it reports lies within what this test saw: after the commit began, before it was counted
    window = metric(home_master, "txbroker_job_groups_visible_seconds_sum")
    assert 0 <= window <= time.monotonic() - decided_by, window
    with ClusterJobCoordinator(GROUP, cluster.bootstrap) as c:  # a re-run by name finds it, on its home
        again = c.open(timeout=60, name="nightly")
        assert (again.job_id, again.info.state, again.info.already) == (job.job_id, "COMMITTED", True)


def test_a_member_group_not_told_follows_its_home_by_itself(cluster):
    """The coordinator dies right after the home's decision: the other group asks its home itself."""
    async def main():
        async with AsyncClusterJobCoordinator(GROUP, cluster.bootstrap) as c:
            job = await c.open(timeout=60)
            other = job.groups[0]
            t = await c.send(job, other, Message("Out", b"told by nobody"))
            await c.groups.members[job.home].commit(job.job_id, [], {other: [t]})  # the home only
            return job, other

    decided_by = time.monotonic()
    job, other = asyncio.run(main())
    wait_until(lambda: job_at(cluster, other, job.job_id)["state"] == "COMMITTED", 10,
               what="the member group to follow its home")
    wait_until(lambda: job_at(cluster, job.home, job.job_id)["resolved"], 10, what="the home to see it resolved")
    assert visible(cluster) == {"told by nobody": 1}
    # the window a consumer of both groups could see the home's part alone: the member group's own
    # ask, not at once (its pass is once a second), and within what this test saw
    home_master = cluster.group(job.home).master
    wait_until(lambda: metric(home_master, "txbroker_job_groups_visible_seconds_count") == 1,
               what="the home to count how long the job took to be visible everywhere")
    window = metric(home_master, "txbroker_job_groups_visible_seconds_sum")
    assert 0 < window <= time.monotonic() - decided_by, window


def test_a_member_that_joins_while_its_group_asks_the_home_ends_as_the_decision_says(cluster):
    """The fault harness, seed 26: g1 asked g0 about its members of a job before they joined (none
    yet); g0's master had just died, so the question waited (the peer client retrying) until g0's
    slave was promoted, and meanwhile the members joined g1 and the job was committed keeping them.
    The answer covered the members asked about (none): g1 recorded COMMIT keeping nothing and
    rolled back the two members the coordinator had been told were committed. Here the home's
    master is paused while g1's question waits on it, and a kept member joins g1 meanwhile."""
    g0, g1 = cluster.group("g0").master, cluster.group("g1").master
    with JobCoordinator(GROUP, g0.address) as home, JobCoordinator(GROUP, g1.address) as member:
        job = home.open(timeout=60, groups=["g1"])
        member.open(60, home="g0", job_id=job.job_id)
    late = f"{job.job_id}-m1"
    # g1 paused while its home decides: its own pass (once a tick) would otherwise learn the decision
    # before the home's pause, and the late member would find g1's entry decided (CI, 2026-12-07)
    g1.proc.send_signal(signal.SIGSTOP)
    try:
        with JobCoordinator(GROUP, g0.address) as home:
            assert home.commit(job.job_id, [], {"g1": [late]}).state == "COMMITTED"
        g0.proc.send_signal(signal.SIGSTOP)
    finally:
        g1.proc.send_signal(signal.SIGCONT)  # g1's pass asks its paused home at once: no member yet

    async def main():
        try:
            async with AsyncJobCoordinator(GROUP, [g1.address]) as c:
                told = asyncio.ensure_future(c.commit(job.job_id, []))  # and so does this: the question waits
                await asyncio.sleep(0.5)
                assert not told.done()
                assert await c.send(job.job_id, Message("Out", b"joined while its group asked"), late) == late
                g0.proc.send_signal(signal.SIGCONT)
                await asyncio.wait([told])
                told.exception()  # answered as g1's entry then stood (maybe not yet published there): no matter
        finally:
            g0.proc.send_signal(signal.SIGCONT)

    asyncio.run(main())
    wait_until(lambda: job_at(cluster, "g1", job.job_id)["state"] == "COMMITTED", 10, what="g1 to follow its home")
    assert AdminClient(g1.admin_url).transaction(late).state == "COMMITTED"
    assert visible(cluster) == {"joined while its group asked": 1}


def test_the_homes_deadline_aborts_the_job_on_every_group(cluster):
    with ClusterJobCoordinator(GROUP, cluster.bootstrap) as c:
        job = c.open(timeout=2)
        members = {g: [c.send(job, g, Message("Out", f"{g}-late".encode()))] for g in job.all_groups}
        wait_until(lambda: c.describe(job).state == "ABORTED", 15, what="the home to abort at the deadline")
        wait_until(lambda: c.describe(job).resolved, 15, what="every group to roll its members back")
    for g, (t,) in members.items():
        assert AdminClient(cluster.group(g).master.admin_url).transaction(t).state == "ROLLED_BACK"
    assert visible(cluster) == {}


def test_a_prepared_job_outlives_its_open_deadline_and_its_own_bound_aborts_it_on_every_group(cluster):
    """A coordinator that prepared its members (Spark's commit=deferred) and then stalls: the OPEN
    deadline no longer applies, the prepared bound does, and it reaches every group."""
    with ClusterJobCoordinator(GROUP, cluster.bootstrap) as c:
        job = c.open(timeout=5, prepared_timeout=8)
        members = {g: [c.send(job, g, Message("Out", f"{g}-prepared".encode()))] for g in job.all_groups}
        info = c.prepare(job, members)
        assert info.state == "PREPARED" and info.prepared_deadline_ms > info.deadline_ms
        wait_until(lambda: c.describe(job).state == "ABORTED", 20, what="the prepared bound to abort the job")
        info = c.describe(job)
        assert info.by == "deadline" and info.decided_ms >= info.prepared_deadline_ms  # not at the OPEN deadline
        wait_until(lambda: c.describe(job).resolved, 15, what="every group to roll its members back")
    for g, (t,) in members.items():
        assert AdminClient(cluster.group(g).master.admin_url).transaction(t).state == "ROLLED_BACK"
    assert visible(cluster) == {}


@pytest.mark.parametrize("when", ["before the decision", "between the decision and visibility"])
@pytest.mark.parametrize("victim", ["home", "member group"])
def test_a_job_spanning_groups_survives_a_master_killed_midway(cluster, victim, when):
    async def main():
        async with AsyncClusterJobCoordinator(GROUP, cluster.bootstrap, request_timeout=20) as c:
            job = await c.open(timeout=120)
            other = job.groups[0]
            members = {g: [await c.send(job, g, Message("Out", f"{g}-{i}".encode())) for i in range(4)]
                       for g in job.all_groups}
            g = cluster.group(job.home if victim == "home" else other)

            def kill_and_fail_over():
                g.master.kill(signal.SIGKILL)
                cluster.promote(g, 1, epoch=2)
                cluster.rejoin(g, 0)

            if when == "before the decision":
                await asyncio.to_thread(kill_and_fail_over)
                await c.commit(job, members)
            else:
                await c.groups.members[job.home].commit(job.job_id, members[job.home], {other: members[other]})
                await asyncio.to_thread(kill_and_fail_over)
            return await c.wait_resolved(job, 30)

    info = asyncio.run(main())
    assert info.state == "COMMITTED" and info.resolved, info
    assert visible(cluster) == {f"{g}-{i}": 1 for g in ("g0", "g1") for i in range(4)}


def test_bad_input_is_refused_naming_what_was_wrong(cluster):
    g0, g1 = cluster.group("g0").master, cluster.group("g1").master
    with JobCoordinator(GROUP, g0.address) as home, JobCoordinator(GROUP, g1.address) as member:
        job = home.open(timeout=60, groups=["g1"])
        member.open(60, home="g0", job_id=job.job_id)

        def refused(call, code, *words):
            with pytest.raises(BrokerError) as e:
                call()
            assert e.value.code_name == code, e.value
            for w in words:
                assert w in e.value.remark, e.value.remark

        refused(lambda: home.open(timeout=60, groups=["g7"]), "MESSAGE_ILLEGAL", "unknown member group 'g7'")
        refused(lambda: member.open(60, home="g9", job_id=job.job_id), "MESSAGE_ILLEGAL", "unknown home group 'g9'")
        refused(lambda: member.prepare(job.job_id, []), "ILLEGAL_OPERATION", "home group g0")
        refused(lambda: member.commit(job.job_id, []), "ILLEGAL_OPERATION", "not decided yet")
        refused(lambda: home.commit(job.job_id, [], {"g7": ["x"]}), "MESSAGE_ILLEGAL", "g7", "not opened with")
        refused(lambda: home.commit(job.job_id), "MESSAGE_ILLEGAL", "every group it spans")
        with JobCoordinator("another-pg", g1.address) as stranger:
            refused(lambda: stranger.describe(job.job_id), "TRANSACTION_STATE_GROUP_WRONG", GROUP)
        assert home.describe(job.job_id).state == "OPEN"  # nothing changed
        home.abort(job.job_id)


def test_a_member_group_whose_home_lost_the_job_parks_its_members(tmp_path):
    """An ASYNC failover of the home lost the job (its slave, promoted, never had it): the members on
    the other group would wait forever; after a few UNKNOWN answers they are parked, for an operator."""
    at = FLAGS.index("--replication-mode")
    c = start_cluster(tmp_path, flags=(*FLAGS[:at], "--replication-mode", "ASYNC", *FLAGS[at + 2:]))
    try:
        g0, g1 = c.group("g0"), c.group("g1")
        g0.brokers[1].kill()  # the home's slave misses what comes next
        with JobCoordinator(GROUP, g0.master.address) as home, JobCoordinator(GROUP, g1.master.address) as member:
            job = home.open(timeout=60, groups=["g1"])
            member.open(60, home="g0", job_id=job.job_id)
            orphan = member.send(job.job_id, Message("Out", b"orphan"))
        g0.master.kill()
        g0.brokers[1].start()
        c.promote(g0, 1, epoch=2)
        admin = AdminClient(g1.master.admin_url)
        wait_until(lambda: admin.transaction(orphan).state == "PARKED", 20, what="the member parked")
        assert orphan in run_cli("tx", "list", "--state", "parked", "--admin", g1.master.admin_url).stdout
        assert admin.post(f"/api/v1/transactions/{orphan}/rollback")["state"] == "ROLLED_BACK"  # an operator decides
    finally:
        c.stop()


def test_a_jobs_home_group_does_not_drain_while_a_group_waits_on_its_decision(cluster):
    """A job's home keeps the one decision its other groups follow, so it may not leave the cluster
    before they have it: the home counts its undecided job as held, and each other group says it
    waits on the home (`waiting_on`), as a spanning transaction's participants do. (Found by the fault
    harness: a home drained and removed mid-job left the other group's member waiting on a group
    that no longer existed.)"""
    with ClusterJobCoordinator(GROUP, cluster.bootstrap) as c:
        job = c.open(timeout=60, name="drain-me")
        other = job.groups[0]
        member = c.send(job, other, Message("Out", b"on the other group"))
        home = AdminClient(cluster.group(job.home).master.admin_url).get("/api/v1/drain")
        elsewhere = AdminClient(cluster.group(other).master.admin_url).get("/api/v1/drain")
        assert (home["undecided_jobs"], home["drained"]) == (1, False), home
        assert elsewhere["waiting_on"] == {job.home: 1}, elsewhere
        c.commit(job, {other: [member]})
        c.wait_resolved(job, 30)
    wait_until(lambda: AdminClient(cluster.group(other).master.admin_url).get("/api/v1/drain")["waiting_on"] == {},
               what="the other group no longer waiting on the home once it followed the decision")
    assert AdminClient(cluster.group(job.home).master.admin_url).get("/api/v1/drain")["undecided_jobs"] == 0
    assert visible(cluster) == {"on the other group": 1}


def test_no_new_work_waits_on_a_draining_home(cluster):
    """The fault harness, seed 19: a job's member reached its other group after the home group had
    aborted the job at its deadline and been found drained (nothing there waited on it yet); the
    home was removed, and the member waited on a group that no longer existed, forever. A group
    takes no new member of a job, nor a new participant of a transaction, whose home the route
    drains; what it stored before is answered, and ends as the home decides."""
    with ClusterJobCoordinator(GROUP, cluster.bootstrap) as c:
        job = c.open(timeout=60, name="late")
        other = job.groups[0]
        stored = c.send(job, other, Message("Out", b"before the drain"))
        cluster.publish(**{job.home: "draining"})
        with pytest.raises(BrokerError) as refused:
            c.send(job, other, Message("Out", b"after the drain"))
        assert refused.value.code_name == "SERVICE_NOT_AVAILABLE", refused.value
        assert f"home group {job.home} is draining" in refused.value.remark, refused.value.remark
        assert c.send(job, other, Message("Out", b"before the drain"), transaction_id=stored) == stored  # a retry
        c.commit(job, {other: [stored]})
        assert c.wait_resolved(job, 30).resolved
    assert visible(cluster) == {"before the drain": 1}

    from txbroker.client.connection import BrokerClient
    from txbroker.client.transaction_session import TransactionSession

    async def participant():
        client = BrokerClient([cluster.group(other).master.address], request_timeout=5)
        try:
            await TransactionSession(client, GROUP).prepare([Message("Out", b"a late participant")], "late-tx",
                                                            home=job.home)
        finally:
            await client.close()
    with pytest.raises(BrokerError) as refused:
        asyncio.run(participant())
    assert refused.value.code_name == "SERVICE_NOT_AVAILABLE", refused.value
    assert f"home group {job.home} is draining" in refused.value.remark, refused.value.remark
    assert AdminClient(cluster.group(other).master.admin_url).get("/api/v1/drain")["waiting_on"] == {}


def test_a_jobs_home_does_not_drain_before_every_group_followed_its_decision(cluster):
    """The fault harness, seeds 19 and 24: jobs homed on g0 were decided (aborted at their deadline),
    g0 was found drained and removed, and g1's entries of those jobs, holding no member, had not yet
    asked g0 how they ended: they stayed undecided for good. A home holds its decided jobs until
    every group it spans has followed (released), as it keeps a spanning transaction's decision."""
    with ClusterJobCoordinator(GROUP, cluster.bootstrap, request_timeout=2) as c:
        job = c.open(timeout=60, name="follow-me")     # an entry on the other group, no member there
        other = cluster.group(job.groups[0]).master
        home = AdminClient(cluster.group(job.home).master.admin_url)
        other.proc.send_signal(signal.SIGSTOP)         # it cannot follow for now
        try:
            assert c.abort(job).state == "ABORTED"
            held = home.get("/api/v1/drain")
            assert (held["drained"], held.get("unreleased_jobs")) == (False, 1), held
        finally:
            other.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: home.get("/api/v1/drain")["drained"], what="the home drained once the other group followed")
        assert job_at(cluster, job.groups[0], job.job_id)["state"] == "ABORTED"
