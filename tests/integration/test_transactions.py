"""Transactional messaging against a real broker process: the seeds' scenarios and I1-I4."""

import asyncio
import threading
import uuid

import pytest

from support.metrics import metric
from support.waiting import wait_until
from support.listeners import Decided
from txbroker.client import (
    AsyncTransactionProducer, BrokerError, LocalTransactionState as S, Message, Producer, PullConsumer,
    TransactionListener, TransactionProducer,
)
from txbroker.client.admin import AdminClient, AdminError
from txbroker.client.connection import BrokerClient
from txbroker.client.errors import BrokerUnavailable
from txbroker.protocol.bodies import EndTransactionRequest, SendRequest
from txbroker.protocol.codes import RequestCode, TransactionState


def bodies(broker, topic):
    with PullConsumer(broker.address) as c:
        return sorted(m.body.decode() for m in c.read_all(topic))


def pending(broker):
    return AdminClient(broker.admin_url).get("/api/v1/transactions")["total"]


class CyclingListener(TransactionListener):
    """The seeds' TransactionListenerImpl: UNKNOWN first; check-back answers by index % 3."""

    def __init__(self):
        self.index = 0
        self.states = {}
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg, arg):
        with self.lock:
            self.states[msg.transaction_id] = self.index % 3
            self.index += 1
        return S.UNKNOWN

    def check_local_transaction(self, msg):
        return {0: S.UNKNOWN, 1: S.COMMIT, 2: S.ROLLBACK}[self.states.get(msg.transaction_id, 1)]


def test_seed_index_mod_3_resolved_by_check_back(broker):
    listener = CyclingListener()
    with TransactionProducer("please_rename_unique_group_name", broker.address, listener) as p:
        results = [p.send_message_in_transaction(Message("TopicTest", f"msg-{i}".encode()), None) for i in range(12)]
        assert all(r.send_status == "SEND_OK" and r.local_state is S.UNKNOWN for r in results)
        # Nothing is visible before check-back decides (I1).
        assert bodies(broker, "TopicTest") == []
        # Check-back commits 1 mod 3 and rolls back 2 mod 3; 0 mod 3 stay UNKNOWN and pending.
        wait_until(lambda: pending(broker) == 4, what="check-back to resolve the COMMIT and ROLLBACK ones")
    assert bodies(broker, "TopicTest") == sorted(f"msg-{i}" for i in range(12) if i % 3 == 1)
    left = AdminClient(broker.admin_url).get("/api/v1/transactions")["transactions"]
    assert all(t["checks"] >= 1 for t in left)


class TransferListener(TransactionListener):
    """The seeds' transfer example: the local transaction throws, so it is rolled back."""

    def __init__(self, fail: bool):
        self.fail = fail
        self.states = {}

    def execute_local_transaction(self, msg, arg):
        try:
            if self.fail:
                raise RuntimeError("some exception occurred")
            self.states[msg.transaction_id] = S.COMMIT
            return S.COMMIT
        except RuntimeError:
            self.states[msg.transaction_id] = S.ROLLBACK
            return S.ROLLBACK

    def check_local_transaction(self, msg):
        return self.states.get(msg.transaction_id, S.UNKNOWN)


def test_seed_transfer_that_throws_is_rolled_back(broker):
    with TransactionProducer("transfer_account_pg", broker.address, TransferListener(fail=True)) as p:
        r = p.send_message_in_transaction(Message("TopicTransfer", b"transfer bill A->B $100"), None)
    assert r.local_state is S.ROLLBACK and not r.end_error
    assert bodies(broker, "TopicTransfer") == []
    tx = AdminClient(broker.admin_url).get(f"/api/v1/transactions/{r.transaction_id}")
    assert tx["state"] == "ROLLED_BACK"


def test_listener_exception_counts_as_unknown_and_check_back_decides(broker):
    class Raises(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            raise RuntimeError("database down")

        def check_local_transaction(self, msg):
            return S.COMMIT

    with TransactionProducer("pg-raise", broker.address, Raises()) as p:
        r = p.send_message_in_transaction(Message("TopicRaise", b"x"), None)
        assert r.local_state is S.UNKNOWN
        wait_until(lambda: bodies(broker, "TopicRaise") == ["x"], what="check-back commit")


def test_dropped_end_transaction_is_recovered_by_check_back(broker):
    """A producer commits locally but its END_TRANSACTION never reaches the broker."""
    decided = {}

    class Listener(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            decided[msg.transaction_id] = S.COMMIT
            return S.UNKNOWN  # stands for the lost END_TRANSACTION: nothing is sent

        def check_local_transaction(self, msg):
            return decided[msg.transaction_id]

    with TransactionProducer("pg-drop", broker.address, Listener()) as p:
        r = p.send_message_in_transaction(Message("TopicDrop", b"paid"), None)
        wait_until(lambda: bodies(broker, "TopicDrop") == ["paid"], what="check-back to commit the dropped END")
        tx = AdminClient(broker.admin_url).get(f"/api/v1/transactions/{r.transaction_id}")
        assert tx["state"] == "COMMITTED" and tx["by"] == "check"


def test_many_messages_in_one_transaction_become_visible_together(broker):
    msgs = [Message("TopicA" if i % 2 else "TopicB", f"m{i}".encode()) for i in range(50)]
    with TransactionProducer("pg-batch", broker.address, Decided(S.COMMIT)) as p:
        r = p.send_message_in_transaction(msgs, None)
    assert len(r.msg_ids) == 50 and len(r.queue_offsets) == 50
    assert bodies(broker, "TopicA") == sorted(f"m{i}" for i in range(50) if i % 2)
    assert bodies(broker, "TopicB") == sorted(f"m{i}" for i in range(50) if not i % 2)


def test_sync_flush_commits_concurrent_transactions_in_shared_writes(broker_factory):
    """Group commit: with SYNC flush, the requests that arrive together share one RocksDB write
    and its fsync, as the broker's own flush metrics show, and every commit is acknowledged."""
    b = broker_factory("--flush-disk-type", "SYNC")

    async def send_all():
        async with AsyncTransactionProducer("pg-group", b.address, Decided(S.COMMIT)) as p:
            return await asyncio.gather(*(p.send_message_in_transaction(Message("TopicGroup", f"g{i}".encode()))
                                          for i in range(40)))

    results = asyncio.run(send_all())
    assert all(r.local_state is S.COMMIT and not r.end_error and r.queue_offsets for r in results)
    assert bodies(b, "TopicGroup") == sorted(f"g{i}" for i in range(40))
    writes = metric(b, "txbroker_flush_batch_records_count")
    records = metric(b, "txbroker_flush_batch_records_sum")
    assert records >= 80  # a half and an end record per transaction (plus the topic's creation)
    assert writes < records, f"{writes:.0f} writes for {records:.0f} records: no write was shared"


def test_end_transaction_is_idempotent_and_never_revives(broker):
    """I3: duplicate commits land once; commit after rollback and the reverse are refused."""
    with TransactionProducer("pg-dup", broker.address, Decided(S.COMMIT)) as p:
        r = p.send_message_in_transaction(Message("TopicDup", b"once"), None)
        again = p.end(r.transaction_id, S.COMMIT)
        assert again.already and again.queue_offsets == r.queue_offsets
        with pytest.raises(BrokerError) as e:
            p.end(r.transaction_id, S.ROLLBACK)
        assert e.value.code_name == "TRANSACTION_SHOULD_COMMIT"
    with TransactionProducer("pg-dup", broker.address, Decided(S.ROLLBACK)) as p:
        rb = p.send_message_in_transaction(Message("TopicDup", b"never"), None)
        with pytest.raises(BrokerError) as e:
            p.end(rb.transaction_id, S.COMMIT)
        assert e.value.code_name == "TRANSACTION_SHOULD_ROLLBACK" and "rolled back" in e.value.remark
    assert bodies(broker, "TopicDup") == ["once"]


def test_concurrent_duplicate_commits_land_exactly_once(broker):
    """RocketMQ issue 5574: racing END_TRANSACTIONs (producer, retries, check-back) for one transaction."""
    with TransactionProducer("pg-race", broker.address, Decided(S.UNKNOWN)) as p:
        txids = [p.send_message_in_transaction(Message("TopicRace", f"r{i}".encode()), None).transaction_id
                 for i in range(20)]
        errors = []

        def commit_all():
            for t in txids:
                try:
                    p.end(t, S.COMMIT)
                except BrokerError as e:  # pragma: no cover - would be the bug
                    errors.append(e)

        threads = [threading.Thread(target=commit_all) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert bodies(broker, "TopicRace") == sorted(f"r{i}" for i in range(20))


def test_retried_half_send_with_the_same_id_stores_nothing_new(broker):
    with TransactionProducer("pg-retry", broker.address, Decided(S.COMMIT)) as p:
        txid = uuid.uuid4().hex
        first = p.send_message_in_transaction(Message("TopicRetry", b"r"), None, transaction_id=txid)
        second = p.send_message_in_transaction(Message("TopicRetry", b"r"), None, transaction_id=txid)
    assert second.msg_ids == first.msg_ids
    assert bodies(broker, "TopicRetry") == ["r"]


def test_wrong_producer_group_and_unknown_transaction_are_refused(broker):
    with TransactionProducer("owner", broker.address, Decided(S.UNKNOWN)) as owner, \
            TransactionProducer("intruder", broker.address, Decided(S.UNKNOWN)) as intruder:
        r = owner.send_message_in_transaction(Message("TopicOwn", b"mine"), None)
        with pytest.raises(BrokerError) as e:
            intruder.end(r.transaction_id, S.COMMIT)
        assert e.value.code_name == "TRANSACTION_STATE_GROUP_WRONG" and "'owner'" in e.value.remark
        with pytest.raises(BrokerError) as e:
            intruder.end("no-such-transaction", S.COMMIT)
        assert e.value.code_name == "QUERY_NOT_FOUND" and "no-such-transaction" in e.value.remark
        owner.end(r.transaction_id, S.ROLLBACK)
    assert bodies(broker, "TopicOwn") == []


def test_end_transaction_at_the_wrong_offset_is_refused_and_changes_nothing(broker):
    """END_TRANSACTION is validated against where the half message is stored (DESIGN step 3)."""
    admin = AdminClient(broker.admin_url)
    with TransactionProducer("pg-offset", broker.address, Decided(S.UNKNOWN)) as p:
        r = p.send_message_in_transaction(Message("TopicOffset", b"o"), None)
        wrong = r.commit_log_offset + 1
        with pytest.raises(BrokerError) as e:
            p.end(r.transaction_id, S.COMMIT, wrong)
        assert e.value.code_name == "ILLEGAL_OPERATION"
        assert f"stored at offset {r.commit_log_offset}, not {wrong}" in e.value.remark
        assert admin.get(f"/api/v1/transactions/{r.transaction_id}")["state"] == "PREPARED"
        assert bodies(broker, "TopicOffset") == []
        p.end(r.transaction_id, S.COMMIT, r.commit_log_offset)
    assert bodies(broker, "TopicOffset") == ["o"]


def test_listener_returning_none_leaves_the_decision_to_check_back(broker):
    """None from either listener method counts as UNKNOWN: nothing is decided, nothing is visible."""
    admin = AdminClient(broker.admin_url)
    with TransactionProducer("pg-none", broker.address, Decided(None)) as p:
        r = p.send_message_in_transaction(Message("TopicNone", b"n"), None)
        assert r.local_state is S.UNKNOWN and r.queue_offsets == []
        wait_until(lambda: admin.get(f"/api/v1/transactions/{r.transaction_id}")["checks"] >= 2,
                   what="checks answered None")
        assert admin.get(f"/api/v1/transactions/{r.transaction_id}")["state"] == "PREPARED"
        assert bodies(broker, "TopicNone") == []
        p.listener = Decided(S.COMMIT)
        wait_until(lambda: bodies(broker, "TopicNone") == ["n"], what="check-back committing it")


def test_plain_and_committed_messages_share_a_queue_in_order(broker):
    with Producer("plain", broker.address) as plain, \
            TransactionProducer("pg-mix", broker.address, Decided(S.COMMIT)) as tx:
        plain.send(Message("TopicMix", b"p1", queue_id=0))
        tx.send_message_in_transaction(Message("TopicMix", b"t1", queue_id=0), None)
        plain.send(Message("TopicMix", b"p2", queue_id=0))
    with PullConsumer(broker.address) as c:
        r = c.pull("TopicMix", 0, 0)
    assert [m.body for m in r.messages] == [b"p1", b"t1", b"p2"]
    assert [m.queue_offset for m in r.messages] == [0, 1, 2]


def test_immunity_time_delays_checks_without_burning_the_counter(broker):
    """RocketMQ issue 8311: waiting out CHECK_IMMUNITY_TIME_IN_SECONDS counts no check."""
    checked = threading.Event()

    class Listener(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return S.UNKNOWN

        def check_local_transaction(self, msg):
            checked.set()
            return S.UNKNOWN

    admin = AdminClient(broker.admin_url)
    with TransactionProducer("pg-immune", broker.address, Listener()) as p:
        msg = Message("TopicImmune", b"i", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "2"})
        r = p.send_message_in_transaction(msg, None)
        # Several scans (0.3 s apart) pass during the immunity: none may count.
        scans = [admin.post("/api/v1/check-scan") for _ in range(5)]
        assert all(s["checked"] == 0 for s in scans)
        assert admin.get(f"/api/v1/transactions/{r.transaction_id}")["checks"] == 0
        assert not checked.is_set()
        assert checked.wait(10), "check-back after the immunity time"
        assert admin.get(f"/api/v1/transactions/{r.transaction_id}")["checks"] >= 1


def test_transaction_timeout_gates_checks(broker_factory):
    """No half message younger than the group's transaction timeout is checked, or counted."""
    b = broker_factory("--check-interval-ms", "60000", "--transaction-timeout-ms", "3600000")
    admin = AdminClient(b.admin_url)
    with TransactionProducer("pg-young", b.address, Decided(S.UNKNOWN)) as p:
        r = p.send_message_in_transaction(Message("TopicYoung", b"y"), None)
        assert admin.post("/api/v1/check-scan")["checked"] == 0
        assert admin.get(f"/api/v1/transactions/{r.transaction_id}")["checks"] == 0
        p.listener = Decided(S.COMMIT)
        admin.put("/api/v1/groups/pg-young/transaction", {"timeout_ms": 1})  # wakes the check service
        wait_until(lambda: bodies(b, "TopicYoung") == ["y"], what="the check once the timeout is short")
    assert admin.get(f"/api/v1/transactions/{r.transaction_id}")["checks"] == 1


def test_check_max_parks_then_resume_and_commit(broker_factory):
    b = broker_factory("--check-interval-ms", "200", "--transaction-timeout-ms", "100", "--check-max", "3")
    admin = AdminClient(b.admin_url)
    with TransactionProducer("pg-park", b.address, Decided(S.UNKNOWN)) as p:
        r = p.send_message_in_transaction(Message("TopicPark", b"stuck"), None)
        wait_until(lambda: admin.get(f"/api/v1/transactions/{r.transaction_id}")["state"] == "PARKED",
                   what="the transaction to be parked after 3 checks")
    tx = admin.get(f"/api/v1/transactions/{r.transaction_id}")
    assert tx["checks"] == 3
    with PullConsumer(b.address) as c:
        parked = c.read_all("TRANS_CHECK_MAX_TIME_TOPIC")
    assert [m.body for m in parked] == [b"stuck"]
    assert bodies(b, "TopicPark") == []
    admin.post(f"/api/v1/transactions/{r.transaction_id}/resume")
    assert admin.get(f"/api/v1/transactions/{r.transaction_id}")["checks"] == 0
    admin.post(f"/api/v1/transactions/{r.transaction_id}/commit")
    assert bodies(b, "TopicPark") == ["stuck"]


def test_a_transaction_whose_producers_are_gone_is_still_parked_after_check_max(broker_factory):
    """I4 without anyone to ask: each due check is counted all the same, so the transaction is parked
    after checkMax instead of waiting forever."""
    b = broker_factory("--check-interval-ms", "300", "--transaction-timeout-ms", "200", "--check-max", "2")
    admin = AdminClient(b.admin_url)
    with TransactionProducer("pg-gone", b.address, Decided(S.UNKNOWN)) as p:
        r = p.send_message_in_transaction(Message("TopicGone", b"g"), None)
    wait_until(lambda: admin.get(f"/api/v1/transactions/{r.transaction_id}")["state"] == "PARKED",
               what="the transaction parked with no producer connected")
    assert admin.get(f"/api/v1/transactions/{r.transaction_id}")["checks"] == 2
    assert metric(b, "txbroker_checkbacks_without_producer_total") == 2
    assert bodies(b, "TopicGone") == []


def test_reject_transaction_message_answers_no_permission(broker_factory):
    b = broker_factory("--reject-transaction-message")
    with TransactionProducer("pg-reject", b.address, Decided(S.COMMIT)) as p:
        with pytest.raises(BrokerError) as e:
            p.send_message_in_transaction(Message("TopicReject", b"x"), None)
    assert e.value.code_name == "NO_PERMISSION"


def test_slave_refuses_end_transaction_and_changes_nothing(broker_factory):
    b = broker_factory("--role", "slave", "--master", "127.0.0.1:1")

    async def ask():
        client = BrokerClient(b.address, require_master=False)
        try:
            with pytest.raises(BrokerError) as end:
                await client.request(RequestCode.END_TRANSACTION,
                                     EndTransactionRequest("pg", "any-transaction", TransactionState.COMMIT))
            with pytest.raises(BrokerError) as half:
                await client.request(RequestCode.SEND_MESSAGE,
                                     SendRequest("pg", [Message("TopicSlave", b"x")], "tx-1"))
            return end.value, half.value
        finally:
            await client.close()

    end, half = asyncio.run(ask())
    assert end.code_name == "SLAVE_NOT_AVAILABLE" and "slave" in end.remark
    assert half.code_name == "SLAVE_NOT_AVAILABLE"
    info = AdminClient(b.admin_url).get("/api/v1/broker")
    assert info["role"] == "slave" and info["log_end_offset"] == 0
    assert AdminClient(b.admin_url).get("/api/v1/transactions")["total"] == 0
    # A producer given only the slave finds no master and says so.
    with pytest.raises(BrokerUnavailable, match="no master"):
        TransactionProducer("pg-slave", b.address, Decided(S.COMMIT), request_timeout=1).start()


def test_check_back_goes_only_to_the_same_group_and_spreads_over_producers(broker):
    asked = {"a1": 0, "a2": 0, "b": 0}

    def listener(name, state):
        class L(TransactionListener):
            def execute_local_transaction(self, msg, arg):
                return S.UNKNOWN

            def check_local_transaction(self, msg):
                asked[name] += 1
                return state
        return L()

    with TransactionProducer("group-a", broker.address, listener("a1", S.UNKNOWN)) as a1, \
            TransactionProducer("group-a", broker.address, listener("a2", S.UNKNOWN)), \
            TransactionProducer("group-b", broker.address, listener("b", S.COMMIT)):
        txids = [a1.send_message_in_transaction(Message("TopicGroups", f"a{i}".encode()), None).transaction_id
                 for i in range(10)]
        wait_until(lambda: asked["a1"] >= 10 and asked["a2"] >= 10, what="checks spread over both producers of group-a")
        admin = AdminClient(broker.admin_url)
        admin.put("/api/v1/groups/group-a/transaction", {"check_interval_ms": 3_600_000})  # no more checks
        # every check the broker counted reached exactly one producer
        wait_until(lambda: asked["a1"] + asked["a2"] == sum(admin.get(f"/api/v1/transactions/{t}")["checks"]
                                                            for t in txids),
                   what="the producers' checks adding up to the broker's count")
    assert asked["b"] == 0


def test_admin_reload_changes_check_interval_live(broker_factory):
    b = broker_factory("--check-interval-ms", "60000", "--transaction-timeout-ms", "100")
    admin = AdminClient(b.admin_url)
    with TransactionProducer("pg-live", b.address, Decided(S.UNKNOWN)) as p:
        r = p.send_message_in_transaction(Message("TopicLive", b"x"), None)
        p.listener = Decided(S.COMMIT)
        admin.put("/api/v1/groups/pg-live/transaction", {"check_interval_ms": 300, "generation": 7})
        wait_until(lambda: bodies(b, "TopicLive") == ["x"], what="check-back at the new interval")
    assert admin.get("/api/v1/config")["groups"]["pg-live"]["generation"] == 7
    with pytest.raises(AdminError, match="check_interval_ms"):
        admin.put("/api/v1/groups/pg-live/transaction", {"check_interval_ms": "soon"})
    assert admin.get(f"/api/v1/transactions/{r.transaction_id}")["state"] == "COMMITTED"


def test_transaction_defaults_change_live_and_group_settings_survive_a_restart(broker_factory):
    """PUT /api/v1/config/transaction takes effect at once (no restart); a group's own settings are
    stored with the data and are still in force after the broker restarts."""
    b = broker_factory("--check-interval-ms", "3600000", "--transaction-timeout-ms", "3600000")
    admin = AdminClient(b.admin_url)
    with TransactionProducer("pg-defaults", b.address, Decided(S.UNKNOWN)) as p:
        p.send_message_in_transaction(Message("TopicDefaults", b"d"), None)
        p.listener = Decided(S.COMMIT)
        admin.put("/api/v1/config/transaction", {"check_interval_ms": 300, "timeout_ms": 1})
        wait_until(lambda: bodies(b, "TopicDefaults") == ["d"], what="check-back under the new defaults")
    admin.put("/api/v1/groups/pg-kept/transaction", {"check_max": 3, "generation": 4})
    b.restart()
    kept = AdminClient(b.admin_url).get("/api/v1/groups")["pg-kept"]
    assert (kept["check_max"], kept["generation"]) == (3, 4)


def test_metrics_follow_transactions(broker):
    """What a Prometheus user watches: pending half messages, outcomes, and check-backs sent."""
    def m(name, **labels):
        return metric(broker, name, **labels)

    with TransactionProducer("pg-metrics", broker.address, Decided(S.UNKNOWN)) as p:
        r = p.send_message_in_transaction(Message("TopicMetrics", b"m"), None)
        assert m("txbroker_pending_half_messages") == 1
        wait_until(lambda: m("txbroker_checkbacks_sent_total") >= 1, what="a check-back counted")
        p.end(r.transaction_id, S.ROLLBACK)
        p.listener = Decided(S.COMMIT)
        p.send_message_in_transaction(Message("TopicMetrics", b"c"), None)
    assert m("txbroker_pending_half_messages") == 0
    assert m("txbroker_transactions_total", outcome="rollback") == 1
    assert m("txbroker_transactions_total", outcome="commit") == 1
    assert m("txbroker_messages_sent_total", kind="half") == 2


class _UnknownThenCommit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return None   # UNKNOWN: the broker asks back

    def check_local_transaction(self, msg):
        return S.COMMIT


def test_an_idle_producer_answers_check_backs_from_a_new_master_before_they_park(broker_factory):
    """The fault harness on the real node, seed 5: a group's master was deleted while the operator's
    leader was down, and the idle transactional producers reached the new master only at their next
    heartbeat, 30 s on; the new master counted its checks without them and parked 28 transactions
    the producers would have committed. A producer registers with the new master as soon as its
    connection ends (and after a failed heartbeat, soon again), not at its next interval."""
    flags = ("--replication-mode", "ASYNC", "--replication-heartbeat-ms", "100", "--check-interval-ms", "300",
             "--transaction-timeout-ms", "200", "--check-max", "20")
    m = broker_factory(*flags, "--broker-name", "m", name="m")
    s = broker_factory("--role", "slave", "--master", m.address, "--broker-name", "s", *flags, name="s")
    with TransactionProducer("idle-pg", [m.address, s.address], _UnknownThenCommit(), request_timeout=2) as p:
        r = p.send_message_in_transaction(Message("Idle", b"decided by a check"))
        txid = r.transaction_id
        wait_until(lambda: AdminClient(s.admin_url).get("/api/v1/broker")["log_end_offset"]
                   == AdminClient(m.admin_url).get("/api/v1/broker")["log_end_offset"], what="the slave caught up")
        m.kill()
        AdminClient(s.admin_url).post("/api/v1/role", {"role": "master", "epoch": 2})
        wait_until(lambda: AdminClient(s.admin_url).transaction(txid).state in ("COMMITTED", "ROLLED_BACK", "PARKED"), 20,
                   what="the transaction decided or parked on the new master")
        assert AdminClient(s.admin_url).transaction(txid).state == "COMMITTED"
