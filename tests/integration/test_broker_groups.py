"""Broker groups (issue 18) on real brokers: two groups of a SYNC master and its slave, one cluster
file. Clients bootstrap from any broker; transactions that span the groups are all or nothing,
whichever master is killed and wherever; a draining group takes no new messages and says what it
still holds."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections import Counter

import pytest

from support.cli import run_cli
from support.metrics import metric
from support.groups import FLAGS, start_cluster
from support.waiting import WaitTimedOut, wait_until
from support import txload
from txbroker.client import (
    AsyncClusterTransactionProducer, BrokerError, ClientError, ClusterProducer, ClusterPushConsumer,
    ClusterTransactionProducer, ConsumeStatus, LocalTransactionState as S, Message, Producer, TransactionListener, hash_selector, key_selector,
)
from txbroker.client.admin import AdminClient, AdminError
from txbroker.client.connection import BrokerClient

GROUP = "groups-pg"


@pytest.fixture
def cluster(tmp_path):
    c = start_cluster(tmp_path)
    yield c
    c.stop()


def spread(n, m, arg):
    """Message body 'a...' to the first queue of the first group, anything else to the last queue of the last."""
    return 0 if m.body.startswith(b"a") else n - 1


class Decide(TransactionListener):
    def __init__(self, state=S.COMMIT, check=S.COMMIT):
        self.state, self.check = state, check
        self.checked = []

    def execute_local_transaction(self, msg, arg):
        return self.state

    def check_local_transaction(self, msg):
        self.checked.append(msg.transaction_id)
        return self.check


class Collect:
    """A push consumer's listener that counts what it is given."""

    def __init__(self):
        self.got: Counter = Counter()
        self._lock = threading.Lock()

    def consume_message(self, msgs, ctx):
        with self._lock:
            self.got.update(m.body.decode() for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS


def visible(c, topic="Orders") -> Counter:
    seen = Counter()
    for g in c.groups:
        seen += txload.visible(g.master.address, topic)
    return seen


def test_clients_bootstrap_from_any_broker_and_use_every_group(cluster):
    take = Collect()
    got = take.got
    with ClusterProducer("plain-pg", cluster.bootstrap) as p:
        assert [g.name for g in p.route.groups] == ["g0", "g1"]
        assert p.route.group("g0").addresses == cluster.group("g0").addresses
        groups = Counter()
        for i in range(40):
            r = p.send(Message("Orders", f"k{i}".encode(), keys=f"customer-{i}"), hash_selector)
            groups.update(r.groups)
        assert set(groups) == {"g0", "g1"}, groups
        unkeyed = Counter(p.send(Message("Orders", f"u{i}".encode())).groups[0] for i in range(4))
        assert unkeyed == {"g0": 2, "g1": 2}  # a send without a selector goes whole to the next group in turn
    with ClusterPushConsumer("groups-cg", cluster.bootstrap, "Orders", take, rebalance_interval=1.0,
                             offset_commit_interval=0.2) as c:
        wait_until(lambda: sum(got.values()) >= 44, what="every message consumed")
        assert {g for g, _t, _q in c.assigned} == {"g0", "g1"}
    assert set(got) == {f"k{i}" for i in range(40)} | {f"u{i}" for i in range(4)} and set(got.values()) == {1}
    for g in cluster.groups:  # each group keeps the offsets of its own queues
        admin = AdminClient(g.master.admin_url)
        committed = sum(o for (_t, _q), o in _offsets(g.master.address).items())
        assert committed == sum(q.max_offset for q in admin.topic("Orders").queues)


def _offsets(address):
    from txbroker.client import PullConsumer

    with PullConsumer(address) as c:
        committed, _ends = c.committed_offsets("groups-cg", "Orders")
    return {("Orders", q): o for q, o in committed.items()}


def test_a_transaction_spanning_groups_commits_everywhere_or_nowhere(cluster):
    listener = Decide()
    with ClusterTransactionProducer(GROUP, cluster.bootstrap, listener) as p:
        r = p.send_message_in_transaction([Message("Orders", b"a-commit"), Message("Orders", b"b-commit")],
                                          selector=spread)
        assert (r.send_status, r.local_state, r.end_error) == ("SEND_OK", S.COMMIT, "")
        listener.state = S.ROLLBACK
        p.send_message_in_transaction([Message("Orders", b"a-rollback"), Message("Orders", b"b-rollback")],
                                      selector=spread)
        listener.state, listener.check = S.UNKNOWN, S.COMMIT  # the home checks back; the participant follows it
        unknown = p.send_message_in_transaction([Message("Orders", b"a-unknown"), Message("Orders", b"b-unknown")],
                                                selector=spread)
        assert unknown.local_state is S.UNKNOWN
        wait_until(lambda: visible(cluster) == {"a-commit": 1, "b-commit": 1, "a-unknown": 1, "b-unknown": 1},
                   what="the committed and checked-back transactions visible on both groups, the rolled back nowhere")
        # the home asked about the undecided one; the participant never asked its producers anything (it
        # follows its home). (On a loaded host the home may also ask about one whose END is late: fine.)
        assert unknown.transaction_id in listener.checked
        assert metric(cluster.group("g1").master, "txbroker_checkbacks_sent_total") == 0
        assert metric(cluster.group("g0").master, "txbroker_checkbacks_sent_total") >= 1
        listener.state = S.COMMIT  # keys hashed over both groups' queues, as README shows it
        keyed = p.send_message_in_transaction([Message("Billing", f"bill-{i}".encode(), keys=f"customer-{i}")
                                               for i in range(8)], "order-42", selector=key_selector)
        assert keyed.groups == ["g0", "g1"] and keyed.end_error == "", keyed
        wait_until(lambda: sum(visible(cluster, "Billing").values()) == 8, what="all eight visible")
    assert txload.visible(cluster.group("g0").master.address) == {"a-commit": 1, "a-unknown": 1}
    g1 = AdminClient(cluster.group("g1").master.admin_url)
    assert g1.transaction(unknown.transaction_id).by == "home"


def test_spanning_transactions_whose_end_is_not_waited_for_end_on_every_group(cluster):
    """wait_end=False (issue 33): each send returns with its home's END on its way; flush() returns
    once every home acknowledged and every participant was told, so all is settled at once."""
    listener = Decide()
    with ClusterTransactionProducer(GROUP, cluster.bootstrap, listener, wait_end=False) as p:
        results = []
        for i in range(12):
            listener.state = S.ROLLBACK if i % 3 == 0 else S.COMMIT
            results.append(p.send_message_in_transaction([Message("Orders", f"a-{i}".encode()),
                                                          Message("Orders", f"b-{i}".encode())], selector=spread))
        assert all(r.groups == ["g0", "g1"] and r.ended is not None for r in results)
        p.flush()
        assert all(r.ended.done() and r.end_error == "" for r in results)
        assert all(r.queue_offsets for r in results if r.local_state is S.COMMIT)
    expected = {f"{side}-{i}": 1 for i in range(12) if i % 3 for side in "ab"}
    wait_until(lambda: visible(cluster) == expected, what="the committed ones visible on both groups, once")
    assert all(txload.settled(g.master.admin_url) for g in cluster.groups)


@pytest.mark.parametrize("when", ["between the halves and the decision", "between the decision and visibility"])
@pytest.mark.parametrize("victim", ["g0", "g1"])  # g0 holds the home half message, g1 the participant
def test_a_transaction_spanning_groups_survives_a_master_killed_midway(cluster, victim, when):
    g = cluster.group(victim)
    txid = f"span-{victim}-{len(when)}"

    def kill_and_fail_over():
        g.master.kill(signal.SIGKILL)
        cluster.promote(g, 1, epoch=2)  # as the operator: the slave takes over, the old master rejoins
        cluster.rejoin(g, 0)

    async def main():
        async with AsyncClusterTransactionProducer(GROUP, cluster.bootstrap, Decide()) as p:
            begun = await p.begin(await p.place([Message("Orders", b"a-1"), Message("Orders", b"b-1")], spread,
                                                None), txid)
            assert begun.home == "g0" and set(begun.participants) == {"g1"}
            if when.startswith("between the halves"):
                await asyncio.to_thread(kill_and_fail_over)
                return await p.finish(begun, S.COMMIT)  # the ENDs follow the new master
            # the decision reaches the home only, then a master dies before the participant hears of it
            decided = await p.groups.members["g0"].session.finish(begun.home_half, S.COMMIT)
            await asyncio.to_thread(kill_and_fail_over)
            return decided

    r = asyncio.run(main())
    assert r.end_error == "", r
    wait_until(lambda: visible(cluster) == {"a-1": 1, "b-1": 1}, 30, what="both halves visible, once")
    assert txload.visible(cluster.group("g1").master.address) == {"b-1": 1}
    assert AdminClient(cluster.group("g1").master.admin_url).transaction(txid).by == "home"


def test_a_participant_never_takes_a_producers_word_against_its_home(cluster):
    async def main():
        async with AsyncClusterTransactionProducer(GROUP, cluster.bootstrap, Decide()) as p:
            begun = await p.begin(await p.place([Message("Orders", b"a-3"), Message("Orders", b"b-3")], spread, None),
                                  "span-3")
            session = p.groups.members["g1"].session
            with pytest.raises(BrokerError) as undecided:  # the home has not decided: nothing to follow
                await session.end("span-3", S.COMMIT)
            assert "decided by group g0" in str(undecided.value) and "PREPARED" in str(undecided.value)
            await p.groups.members["g0"].session.finish(begun.home_half, S.ROLLBACK)
            with pytest.raises(BrokerError) as against:
                await session.end("span-3", S.COMMIT)
            assert against.value.code_name == "TRANSACTION_SHOULD_ROLLBACK" and "home group g0" in str(against.value)

    asyncio.run(main())
    wait_until(lambda: txload.settled(cluster.group("g1").master.admin_url), what="the participant rolled back")
    assert visible(cluster) == {}


def test_bad_input_names_what_is_wrong(cluster, tmp_path):
    from txbroker.protocol.bodies import SendRequest, SendResponse
    from txbroker.protocol.codes import RequestCode

    async def send(address, home):
        client = BrokerClient([address])
        try:
            return await client.request(RequestCode.SEND_MESSAGE, SendRequest(
                GROUP, [Message("Orders", b"x")], "bad-home", "", home), SendResponse)
        finally:
            await client.close()

    g1 = cluster.group("g1").master
    for home, words in (("g7", "unknown home group 'g7'"), ("g1", "this broker's own group")):
        with pytest.raises(BrokerError) as e:
            asyncio.run(send(g1.address, home))
        assert e.value.code_name == "MESSAGE_ILLEGAL" and words in str(e.value), e.value
    # a route older than the one in force is refused, and the one in force kept
    cluster.publish()
    version = cluster.version
    cluster.version -= 1
    cluster.write()
    wait_until(lambda: f"older than version {version} in force" in g1.log(), what="the stale route refused")
    assert AdminClient(g1.admin_url).get("/api/v1/cluster")["route"]["version"] == version
    with ClusterProducer("plain-pg", cluster.bootstrap) as p:
        with pytest.raises(ValueError, match="chose queue 99 of topic Orders, which has 8 queues on groups g0, g1"):
            p.send(Message("Orders", b"x"), lambda n, m, a: 99)
    with ClusterTransactionProducer(GROUP, cluster.bootstrap, Decide()) as tp:
        with pytest.raises(ValueError, match="chose queue 99"):
            tp.send_message_in_transaction(Message("Orders", b"x"), selector=lambda n, m, a: 99)
    with pytest.raises(BrokerError) as e:  # a participant naming a queue its group does not have
        bad = Message("Orders", b"x", queue_id=99)

        async def participant():
            client = BrokerClient([g1.address])
            try:
                await client.request(RequestCode.SEND_MESSAGE, SendRequest(GROUP, [bad], "bad-queue", "", "g0"),
                                     SendResponse)
            finally:
                await client.close()

        asyncio.run(participant())
    assert "99" in str(e.value) and "Orders" in str(e.value), e.value
    # a group's deposed master, written to as by a client with an old view (clients follow the new
    # master by themselves): refused, naming the master
    g0 = cluster.group("g0")
    old_master = g0.master
    cluster.promote(g0, 1, epoch=2)

    async def to_deposed():
        client = BrokerClient([old_master.address], require_master=False)
        try:
            await client.request(RequestCode.SEND_MESSAGE, SendRequest(GROUP, [Message("Orders", b"late")]),
                                 SendResponse)
        finally:
            await client.close()

    with pytest.raises(BrokerError) as e:
        asyncio.run(to_deposed())
    assert e.value.code_name == "SLAVE_NOT_AVAILABLE" and g0.master.address in str(e.value), e.value


def test_a_broker_refuses_to_start_on_a_cluster_file_it_cannot_use(tmp_path):
    bad = tmp_path / "bad.yaml"
    cases = {
        "cluster: c\nversion: 1\ngroups: []\n": "at least one group",
        "cluster: c\nversion: 1\ngroups:\n- {name: g0, addresses: ['nohost']}\n": "'nohost' is not host:port",
        "cluster: c\nversion: 1\ngroups:\n- {name: G_0, addresses: ['h:1']}\n": "'G_0' is not allowed",
        "cluster: c\nversion: 1\ngroups:\n- {name: g1, addresses: ['h:1']}\n": "group 'g0' is not in cluster file",
        "cluster: c\nversion: 1\ngroups:\n- {name: g0, addresses: ['h:1'], state: gone}\n": "'gone': one of active",
    }
    for text, words in cases.items():
        bad.write_text(text)
        r = run_cli("broker", "--data-dir", str(tmp_path / "d"), "--group", "g0", "--cluster-file", str(bad),
                    check=False)
        assert r.returncode == 2 and words in r.stderr, (text, r.stderr)


def test_a_draining_group_takes_no_new_messages_and_says_what_it_still_holds(cluster):
    g1 = cluster.group("g1")
    with ClusterProducer("plain-pg", cluster.bootstrap) as p:
        for i in range(6):
            p.send(Message("Orders", f"m{i}".encode()))
        held = AdminClient(g1.master.admin_url).get("/api/v1/drain")
        assert (held["undelivered"], held["topics"], held["drained"]) == (3, {"Orders": 3}, False), held
        cluster.publish(g1="draining")
        with Producer("plain-pg", g1.master.address) as direct:
            with pytest.raises(BrokerError) as refused:
                direct.send(Message("Orders", b"late"))
        assert refused.value.code_name == "SERVICE_NOT_AVAILABLE" and "g1 is draining" in str(refused.value)
        assert {p.send(Message("Orders", f"n{i}".encode())).groups[0] for i in range(4)} == {"g0"}
    take = Collect()
    got = take.got
    with ClusterPushConsumer("groups-cg", cluster.bootstrap, "Orders", take, offset_commit_interval=0.2):
        wait_until(lambda: AdminClient(g1.master.admin_url).get("/api/v1/drain")["drained"],
                   what="the draining group emptied by the consumer group")
    assert sum(got.values()) == 10


def test_the_cli_shows_the_groups_and_their_masters(cluster):
    r = run_cli("cluster", "show", "--broker", cluster.bootstrap[0])
    lines = r.stdout.splitlines()
    assert lines[0] == "cluster local, route version 1", r.stdout
    for g in cluster.groups:
        assert any(line.split()[:4] == [g.name, "active", g.master.address, "master"] for line in lines), r.stdout
        assert any(line.split()[:4] == [g.name, "active", g.brokers[1].address, "slave"] for line in lines), r.stdout


class Load:
    """Transactions from one producer, without a selector (each on one group, the groups in turn),
    until stopped; what each acknowledged commit was, and on which group."""

    def __init__(self, bootstrap, route_refresh=10.0):
        self.acked: dict[str, str] = {}  # body -> group
        self.failed = 0
        self.stop = threading.Event()
        self._p = ClusterTransactionProducer("load-pg", bootstrap, Decide(), request_timeout=5,
                                             route_refresh=route_refresh)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._p.start()
        self._thread.start()
        return self

    def _run(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            body = f"t{n}"
            try:
                r = self._p.send_message_in_transaction(Message("Orders", body.encode()))
            except ClientError:  # that group has no master for now: the producer passes it over a while
                self.failed += 1
                continue
            if r.send_status == "SEND_OK" and r.local_state is S.COMMIT and not r.end_error:
                self.acked[body] = r.groups[0]
            else:
                self.failed += 1

    def count(self, group=None) -> int:
        return sum(1 for g in list(self.acked.values()) if group is None or g == group)  # a copy: the load writes

    def __exit__(self, *exc):
        self.stop.set()
        self._thread.join(30)
        self._p.shutdown()


def wait_all_consumed(load, take, timeout=15.0):
    """Wait, while the consumer still runs, until every acknowledged commit reached its listener;
    failing, name what is missing and on which group it was acknowledged."""
    def missing():
        return {b: g for b, g in list(load.acked.items()) if b not in take.got}
    try:
        wait_until(lambda: not missing(), timeout, what="every acknowledged commit consumed")
    except WaitTimedOut:
        gone = missing()
        raise AssertionError(f"{len(gone)} acknowledged commit(s) never consumed: {sorted(gone.items())[:10]}") from None


def test_one_group_failing_over_under_load_leaves_the_other_accepting(cluster):
    """One producer and one consumer group throughout, never restarted: while g1 has no master, g0
    takes transactions and its messages are consumed; after g1's failover the same producer commits
    on g1 again. Every acknowledged commit consumed once."""
    g0, g1 = cluster.group("g0"), cluster.group("g1")
    take = Collect()
    with ClusterPushConsumer("load-cg", cluster.bootstrap, "Orders", take, rebalance_interval=1.0,
                             offset_commit_interval=0.2):
        with Load(cluster.bootstrap) as load:
            wait_until(lambda: load.count("g0") >= 20 and load.count("g1") >= 20, what="transactions on both groups")
            g1.master.kill(signal.SIGKILL)
            on_g1, on_g0 = load.count("g1"), load.count("g0")
            wait_until(lambda: load.count("g0") >= on_g0 + 50, what="g0 accepting while g1 has no master")
            assert load.count("g1") <= on_g1 + 1  # at most one in flight when the master died
            consumed = sum(take.got.values())
            wait_until(lambda: sum(take.got.values()) >= consumed + 20, what="g0's messages consumed meanwhile")
            cluster.promote(g1, 1, epoch=2)
            cluster.rejoin(g1, 0)
            wait_until(lambda: load.count("g1") >= on_g1 + 20, what="the same producer committing on g1 again")
        # the load has stopped; the consumer still runs, so the last commits can still arrive
        wait_all_consumed(load, take)
    wait_until(lambda: txload.settled(g0.master.admin_url) and txload.settled(g1.master.admin_url),
               what="every transaction decided")
    seen = visible(cluster)
    assert set(load.acked) <= set(seen) and set(seen.values()) == {1}, "an acknowledged commit lost or doubled"


def test_scaling_one_two_one_groups_under_load_loses_nothing(tmp_path):
    cluster = start_cluster(tmp_path, groups=1)
    take = Collect()
    got = take.got
    try:
        with ClusterPushConsumer("scale-cg", cluster.bootstrap, "Orders", take, route_refresh=0.5,
                                 rebalance_interval=1.0, offset_commit_interval=0.2):
            with Load(cluster.bootstrap, route_refresh=0.5) as load:
                wait_until(lambda: load.count() >= 30, what="transactions flowing on one group")
                g1 = cluster.add_group(tmp_path)
                wait_until(lambda: "g1" in {g for g in load.acked.values()}, what="new writes using the new group")
                cluster.publish(g1="draining")
                held = AdminClient(g1.master.admin_url).get("/api/v1/drain")
                drain = {}

                def drained():
                    drain.update(AdminClient(g1.master.admin_url).get("/api/v1/drain"))
                    return drain["drained"]

                try:
                    wait_until(drained, 30, what="g1 drained: no new writes, its messages consumed")
                except AssertionError as e:
                    raise AssertionError(f"{e}; g1 last said {drain}") from None
                on_g1 = load.count("g1")
                cluster.remove_group("g1")
                wait_until(lambda: load.count("g0") >= 30 + on_g1, what="writes going on on g0 alone")
            # the load has stopped; the consumer still runs, so the last commits can still arrive
            wait_all_consumed(load, take)
        assert held["draining"] is True, held
        assert on_g1 > 0 and all(n == 1 for b, n in got.items() if b in load.acked), "lost or doubled"
    finally:
        cluster.stop()


def test_ordered_consumption_retries_and_dead_letters_work_on_every_group(cluster):
    """Keys hashed over both groups' queues: each key's messages consumed in order; a message whose
    listener fails goes back to the group that holds it, is retried there, and after its retries
    lands in that group's dead letters."""
    from txbroker.client import ConsumeOrderlyStatus, PullConsumer
    from txbroker.protocol.names import dlq_topic

    keys = [f"account-{i}" for i in range(8)]
    with ClusterProducer("ordered-pg", cluster.bootstrap) as p:
        groups_of = {}
        for n in range(5):
            for k in keys:
                groups_of[k] = p.send(Message("Ledger", f"{k}:{n}".encode(), keys=k), hash_selector).groups[0]
        assert set(groups_of.values()) == {"g0", "g1"}
        doomed = p.send(Message("Payments", b"poison"), lambda n, m, a: n - 1).groups[0]  # the last group's queue
        p.send(Message("Payments", b"fine"), lambda n, m, a: 0)
    order: dict[str, list[int]] = {}
    lock = threading.Lock()

    class InOrder:
        def consume_message(self, msgs, ctx):
            with lock:
                for m in msgs:
                    k, n = m.body.decode().split(":")
                    order.setdefault(k, []).append(int(n))
            return ConsumeOrderlyStatus.SUCCESS

    with ClusterPushConsumer("ordered-cg", cluster.bootstrap, "Ledger", InOrder(), orderly=True,
                             rebalance_interval=1.0):
        wait_until(lambda: sum(len(v) for v in order.values()) >= 40, what="every ledger message consumed")
    assert order == {k: list(range(5)) for k in keys}

    tries = Counter()

    class FailPoison:
        def consume_message(self, msgs, ctx):
            with lock:
                tries.update(m.body.decode() for m in msgs)
            return (ConsumeStatus.RECONSUME_LATER if any(m.body == b"poison" for m in msgs)
                    else ConsumeStatus.CONSUME_SUCCESS)

    with ClusterPushConsumer("payments-cg", cluster.bootstrap, "Payments", FailPoison(), max_reconsume_times=1,
                             rebalance_interval=1.0):
        dead_on = cluster.group(doomed).master.address
        with PullConsumer(dead_on) as c:
            wait_until(lambda: [m.body for m in c.read_all(dlq_topic("payments-cg"))] == [b"poison"], 60,
                       what=f"the poison message in group {doomed}'s dead letters")
    assert tries["fine"] == 1 and tries["poison"] == 2  # the first delivery and its one retry


def test_a_group_says_which_groups_its_participants_wait_on(cluster):
    """A home group may not leave the cluster while participants elsewhere have not asked it how
    their transaction ended (once it is gone nobody can tell them): each master's drain status
    counts its waiting participants by home, and whoever removes a group asks every other one."""
    g0 = cluster.group("g0")
    AdminClient(g0.master.admin_url).put_group(GROUP, {"check_interval_ms": 600_000, "timeout_ms": 600_000})

    def home_on_g1(n, m, arg):
        return n - 1 if m.body.startswith(b"a") else 0

    async def main():
        async with AsyncClusterTransactionProducer(GROUP, cluster.bootstrap, Decide()) as p:
            begun = await p.begin(await p.place([Message("Orders", b"a-w"), Message("Orders", b"b-w")], home_on_g1,
                                                None), "span-wait")
            assert begun.home == "g1" and set(begun.participants) == {"g0"}
            await p.groups.members["g1"].session.finish(begun.home_half, S.COMMIT)  # decided at home only
            waiting = AdminClient(g0.master.admin_url).get("/api/v1/drain")
            assert waiting["waiting_on"] == {"g1": 1} and waiting["pending_transactions"] == 1, waiting
            await p.groups.members["g0"].session.end(begun.participants["g0"], S.COMMIT)  # it asks its home now

    asyncio.run(main())
    assert AdminClient(g0.master.admin_url).get("/api/v1/drain")["waiting_on"] == {}
    wait_until(lambda: visible(cluster) == {"a-w": 1, "b-w": 1}, what="the transaction visible on both groups")


def test_clients_start_while_a_group_has_no_master_and_take_it_up_once_it_has(cluster):
    g1 = cluster.group("g1")
    g1.master.kill(signal.SIGKILL)  # g1 answers only as a slave until its failover
    take = Collect()
    with ClusterProducer("plain-pg", cluster.group("g0").master.address, request_timeout=2, route_refresh=0.3) as p, \
            ClusterPushConsumer("late-cg", cluster.group("g0").master.address, "Late", take, request_timeout=2,
                                route_refresh=0.3, rebalance_interval=1.0):
        before = Counter(p.send(Message("Late", f"x{i}".encode())).groups[0] for i in range(6))
        assert before == {"g0": 6}, before
        cluster.promote(g1, 1, epoch=2)
        cluster.rejoin(g1, 0)
        wait_until(lambda: p.send(Message("Late", b"probe")).groups[0] == "g1", what="the producer taking g1 up")
        sent = ["x0", "x1", "x2", "x3", "x4", "x5"]
        for i in range(6):
            p.send(Message("Late", f"y{i}".encode()))
            sent.append(f"y{i}")
        wait_until(lambda: set(sent) <= set(take.got), what="the consumer taking g1 up too")


def test_a_home_does_not_drain_before_its_participants_ended_as_published(cluster):
    """The fault harness, seed 366: g2, home of a spanning transaction, was found drained and removed
    while its participant on g1 had ended only on g1's cut-off master, in a record no slave held;
    the slave promoted next held the participant pending, with no home left to ask. A home keeps
    its spanning decisions until every participant's master answers, as published, that it ended:
    it is not drained before."""
    async def decide_at_home_only():
        async with AsyncClusterTransactionProducer(GROUP, cluster.bootstrap, Decide()) as p:
            begun = await p.begin(await p.place([Message("Orders", b"a-9"), Message("Orders", b"b-9")], spread,
                                                None), "span-9")
            assert begun.home == "g0" and set(begun.participants) == {"g1"}
            cluster.group("g1").master.proc.send_signal(signal.SIGSTOP)   # it cannot follow for now
            await p.groups.members["g0"].session.finish(begun.home_half, S.ROLLBACK)   # no message to deliver

    home = AdminClient(cluster.group("g0").master.admin_url)
    try:
        asyncio.run(decide_at_home_only())
        held = home.get("/api/v1/drain")
        assert (held["drained"], held["pending_transactions"], held.get("unreleased_decisions")) == (False, 0, 1), held
    finally:
        cluster.group("g1").master.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: home.get("/api/v1/drain")["drained"], what="the home drained once its participant ended")
    assert AdminClient(cluster.group("g1").master.admin_url).transaction("span-9").by == "home"


def test_a_retried_half_send_learns_what_the_first_stored_though_the_group_now_drains(cluster):
    """Second review, defect 6 (I3): a half send stored on g1 whose answer was lost was retried after
    g1 began draining; the retry was refused before the duplicate check, so the cluster producer
    placed the same transaction on g0 and committed it there, and g1's check-back committed its own
    copy too: delivered twice. A retry learns what the first try stored, whatever the group's state."""
    listener = Decide(check=S.COMMIT)

    async def main():
        async with AsyncClusterTransactionProducer(GROUP, cluster.bootstrap, listener) as p:
            parts = {"g1": [Message("Orders", b"b-once")]}
            await p.begin(parts, "dup-1")  # stored on g1; say its answer was lost
            await asyncio.to_thread(cluster.publish, g1="draining")
            begun = await p.begin(parts, "dup-1")  # the client's retry of that very send
            assert begun.home == "g1", begun
            return await p.finish(begun, S.COMMIT)

    r = asyncio.run(main())
    assert r.end_error == "", r
    wait_until(lambda: txload.settled(cluster.group("g1").master.admin_url), what="g1's transaction ended")
    assert txload.visible(cluster.group("g1").master.address) == {"b-once": 1}
    with pytest.raises(AdminError) as e:  # never placed again on the other group
        AdminClient(cluster.group("g0").master.admin_url).get("/api/v1/transactions/dup-1")
    assert e.value.status == 404


def test_a_participant_whose_home_lost_the_transaction_is_parked_and_shown(tmp_path):
    """Second review, suspected and reproduced: a home's half message lost in an ASYNC failover left
    its participant asking forever (UNKNOWN is no outcome), pending and unseen. It is parked after a
    few such answers: `tx list --state parked`, the console and the parked-transactions alert show it."""
    at = FLAGS.index("--replication-mode")
    c = start_cluster(tmp_path, flags=(*FLAGS[:at], "--replication-mode", "ASYNC", *FLAGS[at + 2:]))
    try:
        g0, g1 = c.group("g0"), c.group("g1")
        g0.brokers[1].kill()  # the home's slave misses what comes next

        async def main():
            async with AsyncClusterTransactionProducer(GROUP, c.bootstrap, Decide(), request_timeout=2) as p:
                begun = await p.begin(await p.place([Message("Orders", b"a-lost"), Message("Orders", b"b-lost")],
                                                    spread, None), "span-lost")
                assert (begun.home, set(begun.participants)) == ("g0", {"g1"})

        asyncio.run(main())
        g0.master.kill()
        g0.brokers[1].start()
        c.promote(g0, 1, epoch=2)  # the new master never had the home's half message
        admin = AdminClient(g1.master.admin_url)
        wait_until(lambda: admin.transaction("span-lost").state == "PARKED", 30, what="the participant parked")
        assert "span-lost" in run_cli("tx", "list", "--state", "parked", "--admin", g1.master.admin_url).stdout
        assert metric(g1.master, "txbroker_parked_transactions") == 1
        assert txload.visible(g1.master.address) == {}
        drain = admin.get("/api/v1/drain")  # it no longer asks its home; it holds its group for an operator
        assert drain["waiting_on"] == {} and drain["pending_transactions"] == 1 and not drain["drained"], drain
    finally:
        c.stop()


def test_an_administrator_ends_a_participant_against_its_home_only_by_force(cluster):
    """Second review, also: an administrator's commit or rollback of a participant overrode its
    home (documented), which tears the transaction. Refused unless forced; the force names what it
    tears."""

    async def main():
        async with AsyncClusterTransactionProducer(GROUP, cluster.bootstrap, Decide()) as p:
            await p.begin(await p.place([Message("Orders", b"a-adm"), Message("Orders", b"b-adm")], spread, None),
                          "span-adm")

    asyncio.run(main())
    g1 = cluster.group("g1").master
    admin = AdminClient(g1.admin_url)
    with pytest.raises(AdminError) as e:
        admin.post("/api/v1/transactions/span-adm/commit")
    assert e.value.status == 409 and "g0" in str(e.value) and "force" in str(e.value), e.value
    assert admin.transaction("span-adm").state == "PREPARED"
    refused = run_cli("tx", "commit", "span-adm", "--admin", g1.admin_url, check=False)
    assert refused.returncode != 0 and "g0" in refused.stderr
    forced = run_cli("tx", "commit", "span-adm", "--force", "--admin", g1.admin_url)
    assert "tears" in forced.stdout + forced.stderr and "g0" in forced.stdout + forced.stderr
    assert admin.transaction("span-adm").state == "COMMITTED"


def test_a_home_keeps_a_decision_its_participant_has_not_learned_through_size_retention(tmp_path):
    """Second review, defect 2: the home group's size retention deleted a spanning transaction's
    decision while the participant's group was down; the participant then asked, heard UNKNOWN, and
    waited forever (never checked back, never parked, and in its group's drain as waiting_on)."""
    c = start_cluster(tmp_path, flags=(*FLAGS, "--retention-bytes", "20000", "--retention-check-interval-ms", "100"))
    try:
        g0, g1 = c.group("g0"), c.group("g1")

        async def main():
            async with AsyncClusterTransactionProducer(GROUP, c.bootstrap, Decide(), request_timeout=2) as p:
                begun = await p.begin(await p.place([Message("Orders", b"a-kept"), Message("Orders", b"b-kept")],
                                                    spread, None), "span-retained")
                assert (begun.home, set(begun.participants)) == ("g0", {"g1"})
                for b in g1.brokers:  # the participant's group goes down
                    b.proc.send_signal(signal.SIGSTOP)
                await p.groups.members["g0"].session.finish(begun.home_half, S.COMMIT)  # decided at home

        asyncio.run(main())
        decided_by = AdminClient(g0.master.admin_url).broker_info().log_end_offset
        with Producer("filler-pg", g0.master.address) as p:  # the home's log passes its size limit

            def retained_past_the_decision() -> bool:
                p.send(Message("Filler", b"f" * 1000))  # (spread over retention's marks, which are 0.1 s apart)
                return all(AdminClient(b.admin_url).broker_info().log_start_offset > decided_by for b in g0.brokers)

            wait_until(retained_past_the_decision, what="size retention on both of g0's brokers past the decision")
        for b in g1.brokers:
            b.proc.send_signal(signal.SIGCONT)
        admin = AdminClient(g1.master.admin_url)  # (g0's message itself may be retained away by now, as any)
        wait_until(lambda: admin.transaction("span-retained").state == "COMMITTED", 30,
                   what="the participant to learn the decision")
        assert admin.transaction("span-retained").by == "home"
        wait_until(lambda: txload.visible(g1.master.address) == {"b-kept": 1}, what="the participant's message visible")
    finally:
        c.stop()


def test_a_message_waiting_for_its_retry_keeps_its_group_from_draining(broker_factory):
    """A message its consumer refused waits (its retry's delay, then %RETRY%) before it comes back:
    the group still holds it, and must not be drained and removed meanwhile. (Found by the fault
    harness: a group drained while a consumer's retries waited, and they were lost with it.)"""
    from txbroker.client import PushConsumer
    b = broker_factory("--message-delay-level", "1s 1s 1h 1h")  # a refused message's first retry waits an hour
    with Producer("drain-retry-pg", b.address) as p:
        p.send(Message("Orders", b"refused"))
    seen = []

    def refuse(msgs, ctx):
        seen.extend(m.body for m in msgs)
        return ConsumeStatus.RECONSUME_LATER

    c = PushConsumer("drain-retry-cg", b.address, "Orders", refuse, offset_commit_interval=0.1).start()
    try:
        admin = AdminClient(b.admin_url)
        wait_until(lambda: seen and "Orders" not in admin.get("/api/v1/drain")["topics"],
                   what="the message refused and its offset committed past it")
        held = admin.get("/api/v1/drain")
        assert (held["undelivered"], held["drained"]) == (1, False), held
        assert held["topics"] == {"%RETRY%drain-retry-cg": 1}, held
    finally:
        c.shutdown()
