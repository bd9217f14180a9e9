"""spec.restore (operator/txbroker_operator/restore.py), over whole operator passes against the
in-memory API server and brokers of test_operator_group_passes: a new TxBroker's first masters get
the restore step and the status says Restoring, then Restored; a restore step that fails is
reported in a condition and an Event; spec.restore added to a running TxBroker is refused and
changes nothing; pods built after the restore have no restore step, and spec.restore rolls nothing."""

from __future__ import annotations

from txbroker_operator import manifests
from txbroker_operator import constants as c

from test_operator_group_passes import NAME, NS, World, install, passes

SPEC = {"image": "txbroker/broker:1.0", "replicas": 2, "replication": "ASYNC", "failover": {"gracePeriodSeconds": 5}}
RESTORE = {"claimName": "backups", "path": "nightly/{group}"}


def pod(w: World, name: str) -> dict:
    return w.objects[("Pod", name)]


def restore_step(p: dict) -> dict | None:
    steps = [x for x in p["spec"].get("initContainers") or [] if x["name"] == "restore"]
    return steps[0] if steps else None


def condition(st: dict, type_: str) -> dict:
    return next(x for x in st["conditions"] if x["type"] == type_)


def test_a_new_txbroker_restores_each_groups_first_master_then_says_restored(monkeypatch):
    w = install(World({**SPEC, "groups": 2, "restore": RESTORE}), monkeypatch)
    st = passes(w, 1)
    for master, group in (("orders-0", "g0"), ("orders-g1-0", "g1")):
        step = restore_step(pod(w, master))
        assert step["args"] == ["backup", "restore", "--from", f"/restore/nightly/{group}", "--data-dir", "/data",
                                "--if-not-restored"]
        assert step["image"] == "txbroker/broker:1.0" and {"name": "data", "mountPath": "/data"} in step["volumeMounts"]
        assert {"name": "restore", "persistentVolumeClaim": {"claimName": "backups", "readOnly": True}} in \
            pod(w, master)["spec"]["volumes"]
    assert st["restore"]["phase"] in ("Restoring", "Restored")
    assert w.said("Restoring") == ["from claim backups, path /nightly/{group}: each broker group's first master "
                                   "starts from its backup"]
    st = passes(w, 2)   # the in-memory brokers serve at once
    for slave in ("orders-1", "orders-g1-1"):
        assert restore_step(pod(w, slave)) is None   # slaves copy the restored master as any new slave
    assert st["restore"]["phase"] == "Restored"
    assert condition(st, "Restored")["status"] == "True"
    (said,) = w.said("Restored")
    assert "g0 from backups:/nightly/g0" in said and "g1 from backups:/nightly/g1" in said
    # a master's pod built after the restore starts as any other
    for name in [k[1] for k in list(w.objects) if k[0] == "Pod"]:
        w.delete("Pod", NS, name)
    passes(w, 2)
    assert restore_step(pod(w, "orders-0")) is None


def test_spec_restore_does_not_roll_the_pods():
    plain = manifests.broker_pod(NAME, NS, SPEC, 0, c.ROLE_MASTER)
    restoring = manifests.broker_pod(NAME, NS, {**SPEC, "restore": RESTORE}, 0, c.ROLE_MASTER, restore_from="x")
    assert plain["metadata"]["annotations"][c.ANNOTATION_POD_SPEC] == \
        restoring["metadata"]["annotations"][c.ANNOTATION_POD_SPEC]


def test_a_restore_step_that_fails_is_reported_and_the_broker_never_starts(monkeypatch):
    w = install(World({**SPEC, "restore": RESTORE}), monkeypatch)
    passes(w, 1)
    master = pod(w, "orders-0")
    w.brokers.pop(master["status"]["podIP"])   # its broker never started: the init container failed
    master["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    why = ("txbroker backup: data directory /data is not empty: it holds CURRENT, LOCK; a backup is restored only "
           "into an empty directory, for a new broker (nothing was changed)")
    master["status"]["initContainerStatuses"] = [{"name": "restore", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                                  "lastState": {"terminated": {"exitCode": 1, "message": why}}}]
    st = passes(w, 2)
    assert st["restore"]["phase"] == "Restoring"
    cond = condition(st, "Restored")
    assert (cond["status"], cond["reason"]) == ("False", "RestoreRefused") and "is not empty" in cond["message"]
    assert w.said("RestoreRefused") == [f"backups:/nightly/g0: {why}"]   # once, not every pass
    assert not w.said("FailedOver")   # a master that never served is not failed over


def test_spec_restore_on_a_running_txbroker_is_refused_and_changes_nothing(monkeypatch):
    w = install(World(dict(SPEC)), monkeypatch)
    passes(w, 2)
    uids = {k[1]: o["metadata"]["uid"] for k, o in w.objects.items() if k[0] == "Pod"}
    w.txb()["spec"]["restore"] = RESTORE
    st = passes(w, 2)
    assert st["restore"]["phase"] == "Refused"
    cond = condition(st, "Restored")
    assert (cond["status"], cond["reason"]) == ("False", "RestoreRefused")
    (said,) = w.said("RestoreRefused")
    assert "already runs brokers" in said and "nothing was restored, restarted or replaced" in said
    assert {k[1]: o["metadata"]["uid"] for k, o in w.objects.items() if k[0] == "Pod"} == uids
    assert all(restore_step(o) is None for k, o in w.objects.items() if k[0] == "Pod")
    assert st["phase"] == "Running"


def test_spec_restore_removed_takes_what_was_said_of_it_along(monkeypatch):
    w = install(World(dict(SPEC)), monkeypatch)
    passes(w, 2)
    w.txb()["spec"]["restore"] = RESTORE
    assert passes(w, 1)["restore"]["phase"] == "Refused"
    del w.txb()["spec"]["restore"]
    st = passes(w, 2)
    assert "restore" not in st and not any(x["type"] == "Restored" for x in st["conditions"])
