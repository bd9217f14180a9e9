"""The operator's pure decisions: who becomes master, what status says, what pods look like."""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec
from txbroker.store.state import StateMachine
from txbroker.protocol import admin as answers
from txbroker.protocol.admin import TransactionSettings
from txbroker.broker.transaction.settings import SettingsBook
from txbroker_operator import failover, manifests, producer_groups, status, sync_set
from txbroker_operator.brokers import BrokerInfo
from txbroker_operator.failover import Blocked, Promote
from txbroker_operator.observe import Member


def info(role="slave", epoch=1, offset=100, slaves=(), master="10.0.0.1:10911", sync_replicas=0):
    return BrokerInfo(role=role, epoch=epoch, log_end_offset=offset, master="" if role == "master" else master,
                      fenced_by=0, pending=0, parked=0, slaves=tuple(slaves), connected=role == "slave",
                      sync_replicas=sync_replicas)


def member(name, index, broker_info=None, ready=True, ip=None, role_label="slave", spec_hash=""):
    pod = {"metadata": {"name": name, "uid": name, "labels": {"txbroker.dev/index": str(index),
                                                            "txbroker.dev/role": role_label},
                        "annotations": {"txbroker.dev/pod-spec-hash": spec_hash}},
           "status": {"podIP": ip or f"10.0.0.{index + 1}",
                      "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    return Member(name, index, pod, broker_info)


DURABLE = {"replication": "SYNC", "flush": "SYNC", "storage": {"size": "1Gi"}, "replicas": 3}
LAST_SEEN = {"epoch": 3, "master": "b-0", "brokers": [{"name": "b-0", "role": "master", "offset": 120},
                                     {"name": "b-1", "role": "slave", "offset": 110, "inSync": False},
                                     {"name": "b-2", "role": "slave", "offset": 118, "inSync": True}]}


def test_no_failover_within_the_grace_period():
    members = {"b-1": member("b-1", 1, info(offset=110)), "b-2": member("b-2", 2, info(offset=118))}
    assert failover.decide_failover({"failover": {"gracePeriodSeconds": 10}}, LAST_SEEN, members, "b-0", 9.5) is None


def test_async_promotes_the_most_caught_up_slave_at_a_new_epoch():
    members = {"b-1": member("b-1", 1, info(offset=110, epoch=4)), "b-2": member("b-2", 2, info(offset=118))}
    p = failover.decide_failover({"replication": "ASYNC"}, LAST_SEEN, members, "b-0", 30)
    assert isinstance(p, Promote) and p.successor == "b-2"
    assert p.epoch == 5          # above every epoch seen: status 3, a broker's 4
    assert "may lack up to 2 records" in p.message


def test_sync_promotes_only_a_slave_that_was_in_sync():
    members = {"b-1": member("b-1", 1, info(offset=119)), "b-2": member("b-2", 2, info(offset=118))}
    p = failover.decide_failover({"replication": "SYNC"}, LAST_SEEN, members, "b-0", 30)
    assert isinstance(p, Promote) and p.successor == "b-2"    # b-1 is further but was not in sync


def test_sync_without_an_in_sync_slave_waits_for_an_explicit_override():
    """b-1 does not answer: it may hold acknowledged writes b-2 lacks."""
    seen = {**LAST_SEEN, "brokers": [dict(b, inSync=False) for b in LAST_SEEN["brokers"]]}
    members = {"b-1": member("b-1", 1, None), "b-2": member("b-2", 2, info(offset=118))}
    d = failover.decide_failover({"replication": "SYNC"}, seen, members, "b-0", 30)
    assert isinstance(d, Blocked) and d.reason == "NoInSyncSlave" and "allowOutOfSyncPromotion" in d.message
    assert "b-1 does not answer" in d.message
    forced = failover.decide_failover({"replication": "SYNC", "failover": {"allowOutOfSyncPromotion": True}},
                                      seen, members, "b-0", 30)
    assert isinstance(forced, Promote) and forced.successor == "b-2"


def test_a_sync_master_lost_before_any_broker_took_its_epoch_fails_over_to_the_master_before_it():
    """The fault harness, seed 274: a group of two. Its master b-0 was killed, b-1 promoted at epoch 2,
    and b-1's store damaged 1.4 s later, before b-0 (restarted) followed it. b-0 was never reported in
    sync with b-1, so no slave was promotable and the group stayed without a master for good, its
    damaged master failing to start (a damaged store is seeded from a master). But b-0, answering at
    epoch 1, holds no record of epoch 2: SYNC replication acknowledged nothing at epoch 2, and b-0,
    master at epoch 1, holds every write acknowledged before."""
    spec = {"replication": "SYNC", "flush": "SYNC", "storage": {"size": "1Gi"}, "replicas": 2}
    seen = {"epoch": 2, "master": "b-1", "brokers": [
        {"name": "b-0", "role": "slave", "epoch": 1, "offset": 3495},
        {"name": "b-1", "role": "master", "epoch": 2, "offset": 3496, "syncReplicas": 1}]}
    members = {"b-0": member("b-0", 0, info(epoch=1, offset=3495)), "b-1": member("b-1", 1, None, ready=False)}
    p = failover.decide_failover(spec, seen, members, "b-1", 30)
    assert isinstance(p, Promote) and p.successor == "b-0" and p.epoch == 3
    assert "every other broker answers" in p.message


def test_with_every_slave_answering_the_one_furthest_at_the_newest_epoch_holds_every_acknowledged_write():
    """None was reported in sync, all answer: b-1 took the lost master's epoch 3 (so holds a prefix of
    its log, and whatever it acknowledged is on the furthest such slave), b-2 is a deposed master of
    epoch 2 with a longer log of records never acknowledged. b-1 is promoted, not the longest log."""
    seen = {"epoch": 3, "master": "b-0", "brokers": [
        {"name": "b-0", "role": "master", "epoch": 3, "offset": 120, "syncReplicas": 1},
        {"name": "b-1", "role": "slave", "epoch": 3, "offset": 110, "inSync": False},
        {"name": "b-2", "role": "slave", "epoch": 2, "offset": 130, "inSync": False}]}
    members = {"b-1": member("b-1", 1, info(epoch=3, offset=110)), "b-2": member("b-2", 2, info(epoch=2, offset=130))}
    p = failover.decide_failover(DURABLE, seen, members, "b-0", 30)
    assert isinstance(p, Promote) and p.successor == "b-1"
    # one of them silent: it may be the only one holding some acknowledged write
    d = failover.decide_failover(DURABLE, seen, {**members, "b-2": member("b-2", 2, None)}, "b-0", 30)
    assert isinstance(d, Blocked) and d.reason == "NoInSyncSlave" and "b-2 does not answer" in d.message


def test_a_slave_whose_pod_was_deleted_is_still_counted_by_replicas():
    """A review of 259723e: the in-sync slave b-2 held the acknowledged writes; its pod deleted (a
    drain), its status entry went with it, and once the pod was gone it was no member either, so
    "every other broker answers" counted b-1 alone and promoted it without the writes. The group's
    brokers are counted by spec.replicas."""
    seen = {"epoch": 1, "master": "b-0", "brokers": [
        {"name": "b-0", "role": "master", "epoch": 1, "offset": 22, "syncReplicas": 1},
        {"name": "b-1", "role": "slave", "epoch": 0, "offset": 0, "inSync": False, "promotable": False}]}
    members = {"b-1": member("b-1", 1, info(epoch=1, offset=2))}
    d = failover.decide_failover(DURABLE, seen, members, "b-0", 30)
    assert isinstance(d, Blocked) and d.reason == "NoInSyncSlave" and "1 of the group's 2 other brokers" in d.message


def test_no_slave_in_sync_is_promoted_only_where_what_it_acknowledged_is_still_on_it():
    """ASYNC flush (a power cut takes what the page cache held), no spec.storage (a replaced pod
    starts empty): each may have lost what it acknowledged. Every slave with an empty store: none
    holds anything (a lone empty one holds nothing either, so it does not stand in the way)."""
    seen = {"epoch": 3, "master": "b-0", "brokers": [
        {"name": "b-0", "role": "master", "epoch": 3, "offset": 120, "syncReplicas": 1},
        {"name": "b-1", "role": "slave", "epoch": 3, "offset": 110, "inSync": False},
        {"name": "b-2", "role": "slave", "epoch": 3, "offset": 100, "inSync": False}]}
    members = {"b-1": member("b-1", 1, info(epoch=3, offset=110)), "b-2": member("b-2", 2, info(epoch=3, offset=100))}
    assert isinstance(failover.decide_failover(DURABLE, seen, members, "b-0", 30), Promote)
    for spec, why in (({**DURABLE, "flush": "ASYNC"}, "under ASYNC flush"),
                      ({k: v for k, v in DURABLE.items() if k != "storage"}, "without spec.storage")):
        d = failover.decide_failover(spec, seen, members, "b-0", 30)
        assert isinstance(d, Blocked) and why in d.message, (spec, d)
    one_empty = {**members, "b-2": member("b-2", 2, info(epoch=0, offset=0))}
    assert failover.decide_failover(DURABLE, seen, one_empty, "b-0", 30).successor == "b-1"
    empty = {n: member(n, i, info(epoch=0, offset=0)) for i, n in ((1, "b-1"), (2, "b-2"))}
    d = failover.decide_failover(DURABLE, seen, empty, "b-0", 30)
    assert isinstance(d, Blocked) and "every slave that answers has an empty store" in d.message


def test_take_over_prefers_the_newest_epoch_to_the_longest_log():
    """A deposed master of an older epoch may have a longer log than the successor (records it took
    while cut off, never acknowledged); promoting it for its length would drop what the newer epoch
    acknowledged."""
    stale = member("b-2", 2, info(epoch=2, offset=130))
    current = member("b-1", 1, info(epoch=3, offset=110))
    assert failover.most_caught_up([stale, current], current) is current
    assert failover.most_caught_up([stale, member("b-0", 0, info(epoch=3, offset=112))], current).name == "b-0"


def test_a_successor_silent_after_the_fencing_is_not_replaced_by_a_slave_behind_it():
    """The successor was chosen because it holds every acknowledged write; if it does not answer once
    the others follow it (paused, its answer late on a loaded host), a slave that answers may lack
    some: nobody is promoted this pass (CI's run of seed 8 promoted the one behind and lost what only
    the successor held). One at least as far as the successor was when chosen holds all of it too."""
    chosen = info(epoch=4, offset=200)
    behind = member("b-2", 2, info(epoch=4, offset=150))
    silent = member("b-1", 1, None)
    members = {"b-1": silent, "b-2": behind, "b-0": member("b-0", 0, info(role="master", epoch=4, offset=210))}
    assert failover.successor_after_fencing(members, silent, chosen, deposed={"b-0"}) is None
    level = member("b-2", 2, info(epoch=4, offset=200))
    assert failover.successor_after_fencing({**members, "b-2": level}, silent, chosen, {"b-0"}) is level
    # the successor answering: the furthest at the newest epoch, never the deposed master's tail
    answering = member("b-1", 1, info(epoch=4, offset=200))
    assert failover.successor_after_fencing({**members, "b-1": answering}, answering, chosen, {"b-0"}) is answering
    ahead = member("b-2", 2, info(epoch=4, offset=205))
    assert failover.successor_after_fencing({**members, "b-1": answering, "b-2": ahead}, answering, chosen,
                                            {"b-0"}) is ahead


def test_a_master_that_never_served_is_not_failed_over():
    members = {"b-1": member("b-1", 1, info())}
    d = failover.decide_failover({}, {"brokers": [{"name": "b-0", "role": "master"}]}, members, "b-0", 60)
    assert isinstance(d, Blocked) and d.reason == "MasterNeverServed"


def test_failover_can_be_disabled_and_needs_a_live_slave():
    assert failover.decide_failover({"failover": {"enabled": False}}, LAST_SEEN, {}, "b-0", 60).reason == "FailoverDisabled"
    dead = {"b-1": member("b-1", 1, None)}
    assert failover.decide_failover({}, LAST_SEEN, dead, "b-0", 60).reason == "NoSuccessor"


def test_switchover_needs_a_ready_slave_with_nothing_unacknowledged():
    slaves = [{"name": "b-1", "in_sync": True, "lag": 3}, {"name": "b-2", "in_sync": True, "lag": 0}]
    members = {"b-0": member("b-0", 0, info("master", offset=120, slaves=slaves)),
               "b-1": member("b-1", 1, info(offset=117)), "b-2": member("b-2", 2, info(offset=120))}
    p = failover.decide_switchover(members, {"epoch": 1}, "b-0", {"b-1", "b-2"}, "rolling")
    assert p.successor == "b-2" and p.reason == "Switchover" and p.epoch == 2
    assert failover.decide_switchover(members, {"epoch": 1}, "b-0", {"b-1"}, "rolling") is None


def test_status_keeps_what_it_cannot_see_now():
    """With the master gone, slaves keep the sync state it last reported (failover decides on it)."""
    members = {"b-0": member("b-0", 0, None, ready=False, role_label="master"),
               "b-2": member("b-2", 2, info(offset=118))}
    body = {"metadata": {"generation": 4}, "spec": {"replicas": 2}, "status": LAST_SEEN}
    st = status.compute(body, members, "b-0", 3, {"masterUnavailableSince": "2026-11-21T10:00:00Z"})
    by_name = {b["name"]: b for b in st["brokers"]}
    assert by_name["b-0"]["offset"] == 120 and by_name["b-0"]["ready"] is False
    assert by_name["b-2"]["inSync"] is True and by_name["b-2"]["offset"] == 118
    assert st["phase"] == "Recovering" and st["observedGeneration"] == 4
    assert {c["type"]: c["status"] for c in st["conditions"]}["Degraded"] == "True"


def test_a_crash_looping_master_does_not_take_the_slaves_in_sync_state_with_it():
    """A SYNC master restarted by the kubelet answers for a moment before its slaves have
    subscribed again, then crashes again. With fewer slaves in sync than it needs it acknowledges
    nothing, so the slaves it last reported in sync still hold every acknowledged write: they stay
    promotable. Taking "no slave in sync" from that moment blocked failover for good (NoInSyncSlave),
    since a crash-looping master never serves long enough to say otherwise (seen on the node)."""
    spec = {"replicas": 3, "replication": "SYNC"}
    body = {"metadata": {"generation": 1}, "spec": spec, "status": LAST_SEEN}
    slaves = {"b-1": member("b-1", 1, info(offset=110)), "b-2": member("b-2", 2, info(offset=118))}
    restarted = member("b-0", 0, info(role="master", offset=120, slaves=(), sync_replicas=1), ready=False,
                       role_label="master")
    st = status.compute(body, {"b-0": restarted, **slaves}, "b-0", 3, {})
    # inSync says what the master says now; promotable what it said while it could acknowledge
    assert {b["name"]: b.get("inSync") for b in st["brokers"]} == {"b-0": None, "b-1": False, "b-2": False}
    assert {b["name"]: b.get("promotable") for b in st["brokers"]} == {"b-0": None, "b-1": False, "b-2": True}
    p = failover.decide_failover(spec, st, slaves, "b-0", 30)      # then it is down again
    assert isinstance(p, Promote) and p.successor == "b-2"

    # a master acknowledging writes (b-1 live, enough for SYNC) is believed: b-2 lacks them
    live = ({"name": "b-1", "in_sync": True, "lag": 0}, {"name": "b-2", "in_sync": False, "lag": 30})
    serving = member("b-0", 0, info(role="master", offset=150, slaves=live, sync_replicas=1), role_label="master")
    st = status.compute(body, {"b-0": serving, **slaves}, "b-0", 3, {})
    assert {b["name"]: b.get("promotable") for b in st["brokers"]} == {"b-0": None, "b-1": True, "b-2": False}


def test_status_keeps_a_master_whose_pod_was_deleted():
    """`kubectl delete pod <master>`: while its pod terminates and once it is gone, the master keeps
    its last-seen entry (offset, role), so failover still sees a master that served and promotes;
    dropping it looked like a new TxBroker whose master never served, and nothing happened."""
    deleting = member("b-0", 0, None, ready=False, role_label="master")
    deleting.pod["metadata"]["deletionTimestamp"] = "2026-11-21T10:00:00Z"
    slaves = {"b-1": member("b-1", 1, info(offset=110)), "b-2": member("b-2", 2, info(offset=118))}
    body = {"metadata": {"generation": 1}, "spec": {"replicas": 3, "replication": "SYNC"}, "status": LAST_SEEN}
    for members in ({"b-0": deleting, **slaves}, slaves):     # terminating, then gone
        st = status.compute(body, members, "b-0", 3, {})
        assert [b["name"] for b in st["brokers"]] == ["b-0", "b-1", "b-2"]
        gone = st["brokers"][0]
        assert (gone["role"], gone["offset"], gone["ready"]) == ("master", 120, False) and "podIP" not in gone
        p = failover.decide_failover(body["spec"], st, slaves, "b-0", 30)
        assert isinstance(p, Promote) and p.successor == "b-2"


def test_pods_take_their_role_from_their_own_label_and_annotation():
    pod = manifests.broker_pod("b", "ns", {"image": "img"}, 1, "slave", "10.0.0.1:10911")
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in pod["spec"]["containers"][0]["env"]
           if "valueFrom" in e}
    assert env["TXBROKER_ROLE"] == "metadata.labels['txbroker.dev/role']"
    assert env["TXBROKER_MASTER"] == "metadata.annotations['txbroker.dev/master-address']"
    assert pod["metadata"]["annotations"]["txbroker.dev/master-address"] == "10.0.0.1:10911"
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--role") + 1] == "$(TXBROKER_ROLE)"


def test_transaction_defaults_do_not_roll_pods_but_the_image_does():
    base = {"image": "a", "transaction": {"checkIntervalSeconds": 60}}
    assert manifests.pod_spec_hash(base) == manifests.pod_spec_hash({**base, "transaction": {"checkIntervalSeconds": 5}})
    assert manifests.pod_spec_hash(base) != manifests.pod_spec_hash({**base, "image": "b"})
    assert "check_interval_ms = 5000" in manifests.broker_toml({"transaction": {"checkIntervalSeconds": 5}})


def test_producer_group_spec_becomes_broker_settings():
    s = producer_groups.broker_settings({"checkIntervalSeconds": 2, "timeoutSeconds": 1, "checkMax": 4,
                                         "immunitySeconds": 30, "checkMode": "http", "webhookUrl": "http://h/c"})
    assert s == {"check_interval_ms": 2000, "timeout_ms": 1000, "check_max": 4, "default_immunity_ms": 30000,
                 "webhook_url": "http://h/c", "require_job": False}
    assert producer_groups.broker_settings({"checkMode": "ledger", "webhookUrl": "http://h/c"})["webhook_url"] == ""
    assert producer_groups.group_name({"metadata": {"name": "pg"}, "spec": {"groupName": "PG_Orders"}}) == "PG_Orders"


def test_check_mode_ledger_requires_every_transaction_of_the_group_to_join_a_job(tmp_path):
    """ledger: the broker answers from the jobs' decisions and refuses the group's half messages that
    join no job (require_job); every other mode, and none given (the CRD's default, connection), does not."""
    assert producer_groups.broker_settings({"checkMode": "ledger"})["require_job"] is True
    assert producer_groups.broker_settings({"checkMode": "connection"})["require_job"] is False
    assert producer_groups.broker_settings({"checkMode": "http", "webhookUrl": "http://h/c"})["require_job"] is False
    assert producer_groups.broker_settings({})["require_job"] is False
    # the broker takes them as the group's settings (what PUT /api/v1/groups/{group}/transaction does),
    # and what it then lists (GET /api/v1/groups) matches them: the next pass pushes nothing again
    async def applied(want: dict) -> dict:
        state = StateMachine(str(tmp_path / str(want["require_job"])), False, lambda e: None)
        book = SettingsBook(TransactionSettings(), state)
        await book.update_group("orders-publisher", want, 3)[1]
        listed = answers.GroupSettings(**msgspec.structs.asdict(book.for_group("orders-publisher")), generation=3)
        await state.close()
        return listed

    for mode, required in (("ledger", True), ("connection", False)):
        want = producer_groups.broker_settings({"checkMode": mode})
        listed = asyncio.run(applied(want))
        assert listed.require_job is required
        assert producer_groups.runs_settings(listed, want, 3)
        assert not producer_groups.runs_settings(msgspec.structs.replace(listed, require_job=not required), want, 3)


def test_a_master_serves_only_while_its_pod_is_ready_and_its_broker_answers_as_master():
    assert failover.down_reason(member("b-0", 0, info("master"))) == ""
    assert failover.down_reason(member("b-0", 0, info("master"), ready=False)) == "its pod is not ready"
    assert failover.down_reason(member("b-0", 0, None)) == "its admin API does not answer"
    assert failover.down_reason(member("b-0", 0, info("slave"))).startswith("its broker is slave")
    assert failover.down_reason(None) == "its pod is gone"
    refused = member("b-0", 0, None)
    refused.refused = "HTTP 401"          # alive: only the operator's credentials are wrong
    assert failover.down_reason(refused) == ""


def test_failed_over_condition_moves_with_every_failover():
    members = {"b-1": member("b-1", 1, info("master", epoch=2)), "b-0": member("b-0", 0, info(epoch=2))}
    body = {"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {}}
    first = {"time": "2026-11-23T10:00:00Z", "from": "b-0", "to": "b-1", "epoch": 2, "message": "first"}
    st = status.compute(body, members, "b-1", 2, {"lastFailover": first})
    cond = next(c for c in st["conditions"] if c["type"] == "FailedOver")
    assert (cond["status"], cond["lastTransitionTime"]) == ("True", "2026-11-23T10:00:00Z")
    second = dict(first, time="2026-11-23T11:30:00Z", message="second")
    st = status.compute({**body, "status": st}, members, "b-1", 3, {"lastFailover": second})
    cond = next(c for c in st["conditions"] if c["type"] == "FailedOver")
    assert (cond["lastTransitionTime"], cond["message"]) == ("2026-11-23T11:30:00Z", "second")
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")   # others keep the flip rule
    again = status.compute({**body, "status": st}, members, "b-1", 3, {"lastFailover": second})
    assert next(c for c in again["conditions"] if c["type"] == "Ready")["lastTransitionTime"] == ready["lastTransitionTime"]


def test_applied_generation_is_the_oldest_one_running():
    assert producer_groups.applied_generation([{"name": "b-0", "generation": 3}, {"name": "b-1", "generation": 2}]) == 2
    assert producer_groups.applied_generation([]) is None


def test_before_a_promotion_every_broker_that_answers_stops_following_the_old_master():
    """Found by the fault harness (chaos/, seed 19): a slave still following a paused master acknowledged
    the writes that master took on resuming (queued in its sockets) while the successor was already
    master. So the old master and every slave that answers follow the successor before it is promoted;
    one that does not answer (paused, gone) is turned at the next pass."""
    members = {"b-0": member("b-0", 0, info(role="master", offset=120)),
               "b-1": member("b-1", 1, info(offset=110)),
               "b-2": member("b-2", 2, info(offset=118)),
               "b-3": member("b-3", 3, None)}
    fenced = failover.fence_before_promotion(members, "b-2")
    assert sorted(m.name for m in fenced) == ["b-0", "b-1"]


def test_a_master_whose_pod_is_being_deleted_is_fenced_too_while_a_stopping_slave_is_left_alone():
    """A master told to stop serves on while it waits for a handover (a drain's eviction): should a
    failover promote another meanwhile, it must stop taking writes first."""
    members = {"b-0": member("b-0", 0, info(role="master", offset=120)),
               "b-1": member("b-1", 1, info(offset=120)),
               "b-2": member("b-2", 2, info(offset=118))}
    members["b-0"].pod["metadata"]["deletionTimestamp"] = members["b-2"].pod["metadata"]["deletionTimestamp"] = \
        "2026-11-26T00:00:00Z"
    fenced = failover.fence_before_promotion(members, "b-1")
    assert [m.name for m in fenced] == ["b-0"]


def _sync_master(in_sync: int):
    slaves = [{"name": f"b-{i}", "in_sync": i <= in_sync, "lag": 0} for i in (1, 2)]
    return member("b-0", 0, info("master", slaves=slaves, sync_replicas=1))


def _cut_slave(name, index, connected=False, ready=True):
    return member(name, index, BrokerInfo(role="slave", epoch=1, log_end_offset=100, master="10.0.0.1:10911",
                                          fenced_by=0, pending=0, parked=0, slaves=(), connected=connected,
                                          sync_replicas=0), ready=ready)


def test_a_sync_master_cut_off_from_slaves_that_answer_counts_as_down():
    members = {"b-0": _sync_master(0), "b-1": _cut_slave("b-1", 1), "b-2": _cut_slave("b-2", 2)}
    why = failover.master_down_reason(members, "b-0")
    assert "acknowledges no write" in why and "b-1, b-2" in why


def test_a_master_that_acknowledges_or_has_nobody_to_hand_over_to_is_not_cut_off():
    # one slave in sync: it acknowledges (SYNC needs one)
    assert failover.master_down_reason({"b-0": _sync_master(1), "b-1": _cut_slave("b-1", 1),
                                        "b-2": _cut_slave("b-2", 2)}, "b-0") == ""
    # the slaves replicate, only slowly: slow, not cut off
    assert failover.master_down_reason({"b-0": _sync_master(0), "b-1": _cut_slave("b-1", 1, connected=True),
                                        "b-2": _cut_slave("b-2", 2, connected=True)}, "b-0") == ""
    # the slaves are down or not ready: nobody to hand over to
    assert failover.master_down_reason({"b-0": _sync_master(0), "b-1": member("b-1", 1, None),
                                        "b-2": _cut_slave("b-2", 2, ready=False)}, "b-0") == ""
    # ASYNC: a master acknowledges without slaves
    asynchronous = member("b-0", 0, info("master", slaves=[]))
    assert failover.master_down_reason({"b-0": asynchronous, "b-1": _cut_slave("b-1", 1)}, "b-0") == ""


def test_a_slave_that_follows_nobody_is_pointed_at_the_master_not_counted_as_cut_off():
    """The grown fault harness, seed 29: g2's master b6 was cut off from clients and the controller,
    b7 was promoted, and b6, fenced on its return, followed nobody. Counted as a slave 'cut off'
    from b7, it made b7 a master down (no slave in sync) whose failover was blocked (no slave in
    sync); the harness's controller, which unlike the operator converged roles only while its master
    served, never pointed b6 at b7: 363 transactions left pending. A slave not following this master
    is told to (every pass converges roles), not a reason to call the master down."""
    fenced = member("b-1", 1, BrokerInfo(role="slave", epoch=1, log_end_offset=90, master="", fenced_by=2, pending=0,
                                         parked=0, slaves=(), connected=False, sync_replicas=0))
    assert failover.master_down_reason({"b-0": _sync_master(0), "b-1": fenced}, "b-0") == ""
    # following another broker (a deposed master's old address): the same
    elsewhere = _cut_slave("b-2", 2)
    elsewhere.info = dataclasses.replace(elsewhere.info, master="10.0.0.9:10911")
    assert failover.master_down_reason({"b-0": _sync_master(0), "b-2": elsewhere}, "b-0") == ""
    # while a slave that follows it and cannot reach it still counts
    assert "acknowledges no write" in failover.master_down_reason({"b-0": _sync_master(0),
                                                                   "b-1": _cut_slave("b-1", 1)}, "b-0")


def test_sync_failover_waits_for_every_slave_that_may_hold_an_acknowledged_write():
    """SYNC replication acknowledges a write once `sync_replicas` slaves hold it, not every slave in
    sync: with two in sync and one needed, a write acknowledged last may be on either. The fault
    harness (seed 16) cut a group's power: the master down, the slave holding its last acknowledged
    writes still starting, the other (5 records behind) promoted, and those writes were cut off the
    first when it returned. A failover now waits until enough of the slaves that were in sync answer
    that one of them must hold every acknowledged write (any n - k + 1 of n), and takes the furthest."""
    seen = {"epoch": 4, "master": "b-0", "brokers": [
        {"name": "b-0", "role": "master", "offset": 4124, "syncReplicas": 1},
        {"name": "b-1", "role": "slave", "offset": 4120, "inSync": True, "promotable": True},
        {"name": "b-2", "role": "slave", "offset": 4115, "inSync": True, "promotable": True}]}
    only_b2 = {"b-1": member("b-1", 1, None, ready=False), "b-2": member("b-2", 2, info(offset=4115))}
    d = failover.decide_failover({"replication": "SYNC"}, seen, only_b2, "b-0", 30)
    assert isinstance(d, Blocked) and d.reason == "InSyncSlaveDown", d
    assert "b-1" in d.message and "allowOutOfSyncPromotion" in d.message, d.message
    both = {"b-1": member("b-1", 1, info(offset=4120)), "b-2": member("b-2", 2, info(offset=4115))}
    p = failover.decide_failover({"replication": "SYNC"}, seen, both, "b-0", 30)
    assert isinstance(p, Promote) and p.successor == "b-1"
    # every in-sync slave holds every acknowledged write when the master needs them all: one is enough
    all_needed = {**seen, "brokers": [dict(seen["brokers"][0], syncReplicas=2), *seen["brokers"][1:]]}
    p = failover.decide_failover({"replication": "SYNC"}, all_needed, only_b2, "b-0", 30)
    assert isinstance(p, Promote) and p.successor == "b-2"
    forced = failover.decide_failover({"replication": "SYNC", "failover": {"allowOutOfSyncPromotion": True}},
                                      seen, only_b2, "b-0", 30)
    assert isinstance(forced, Promote) and forced.successor == "b-2"


def test_status_records_how_many_slaves_a_sync_master_waits_for():
    head = member("b-0", 0, info(role="master", offset=10, sync_replicas=2), role_label="master")
    entries = status.broker_entries({"b-0": head}, "b-0", [])
    assert entries[0]["syncReplicas"] == 2
    down = status.broker_entries({"b-0": member("b-0", 0, None, ready=False, role_label="master")}, "b-0", entries)
    assert down[0]["syncReplicas"] == 2   # kept while it does not answer: failover reads it then


def test_the_sync_set_grows_in_the_status_before_the_master_and_shrinks_after_it():
    """The status always names at least every slave the master counts (sync_set.py)."""
    calls = []
    view = {"syncSet": {"epoch": 4, "slaves": ["b-1"]}}

    def save(s):
        calls.append(("save", s["slaves"]))
        view["syncSet"] = s

    def push(epoch, slaves):
        calls.append(("push", slaves))
        return dataclasses.replace(head.info, sync_set=tuple(slaves))

    slaves = ({"name": "b-1", "in_sync": True}, {"name": "b-2", "in_sync": False})
    head = member("b-0", 0, dataclasses.replace(info(role="master", epoch=4, slaves=slaves), sync_set=("b-1",)))
    assert sync_set.keep(view, head, save, push) == ["b-2"]   # who it approved: the operator logs them
    assert calls == [("save", ["b-1", "b-2"]), ("push", ["b-1", "b-2"])]
    # the master forgot b-1 (b-2 holds all it had) and it left: the status follows the master
    calls.clear()
    head = member("b-0", 0, dataclasses.replace(info(role="master", epoch=4, slaves=slaves[1:]), sync_set=("b-2",)))
    assert sync_set.keep(view, head, save, push) == []
    assert calls == [("save", ["b-2"])]
    # a master that counts every slave (no controller, or older) reports no set: none kept for it
    calls.clear()
    view["syncSet"] = {"epoch": 4, "slaves": ["b-2"]}
    sync_set.keep(view, member("b-0", 0, info(role="master", epoch=4, slaves=slaves)),
                  lambda s: calls.append(("save", s)), push)
    assert calls == [("save", None)]


def test_the_sync_set_of_the_lost_masters_own_epoch_counts_after_an_abandoned_switchover():
    """A switchover abandoned leaves the status at the next epoch while the master stays at its own:
    the set kept at the master's epoch still names who may hold what it acknowledged."""
    seen = {"epoch": 6, "master": "b-0", "syncSet": {"epoch": 5, "slaves": ["b-1", "b-2"]},
            "brokers": [{"name": "b-0", "role": "master", "epoch": 5, "offset": 120, "syncReplicas": 1},
                        {"name": "b-1", "role": "slave", "epoch": 5, "offset": 120},
                        {"name": "b-2", "role": "slave", "epoch": 5, "offset": 110}]}
    d = failover.decide_failover(DURABLE, seen, {"b-2": member("b-2", 2, info(epoch=5, offset=110))}, "b-0", 30)
    assert isinstance(d, Blocked) and d.reason == "InSyncSlaveDown" and "b-1" in d.message, d


def test_a_successor_silent_before_it_served_is_stood_in_for_only_by_one_as_far():
    """b-1 was chosen at epoch 6 for holding every acknowledged write (epoch 5, offset 200) and went
    silent before it was promoted; the next decision sees it as the master, down. A slave behind
    where it was would lose what only it (and the lost master) held."""
    seen = {"epoch": 6, "master": "b-1", "successorAt": {"name": "b-1", "forEpoch": 6, "epoch": 5, "offset": 200},
            "brokers": [{"name": "b-0", "role": "slave", "epoch": 5, "offset": 230},
                        {"name": "b-1", "role": "master", "epoch": 5, "offset": 200},
                        {"name": "b-2", "role": "slave", "epoch": 5, "offset": 150, "promotable": True}]}
    behind = {"b-2": member("b-2", 2, info(epoch=5, offset=150))}
    d = failover.decide_failover(DURABLE, seen, behind, "b-1", 30)
    assert isinstance(d, Blocked) and d.reason == "SuccessorSilent", d
    level = {"b-2": member("b-2", 2, info(epoch=5, offset=200))}
    d = failover.decide_failover(DURABLE, seen, level, "b-1", 30)
    assert isinstance(d, Promote) and d.successor == "b-2" and d.epoch == 7, d
    assert d.position() == {"name": "b-2", "forEpoch": 7, "epoch": 5, "offset": 200}
    # once b-1 served at its epoch, the choice is history: an ordinary failover
    served = {**seen, "brokers": [{**b, "epoch": 6} if b["name"] == "b-1" else b for b in seen["brokers"]]}
    assert failover.decide_failover(DURABLE, served, behind, "b-1", 30).reason != "SuccessorSilent"
