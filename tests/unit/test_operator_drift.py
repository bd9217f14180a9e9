"""Drift repair: the patch that puts an owned object back, touching only what the operator owns."""

from __future__ import annotations

import copy

from txbroker_operator import drift, manifests

OWNER = {"apiVersion": "txbroker.dev/v1alpha1", "kind": "TxBroker", "name": "orders", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}


def built(obj):
    obj = copy.deepcopy(obj)
    obj["metadata"]["ownerReferences"] = [OWNER]
    return obj


def as_stored(obj):
    """What the API server returns: our object plus fields it fills in."""
    stored = copy.deepcopy(obj)
    stored["metadata"].update(uid="x", resourceVersion="7", creationTimestamp="2026-11-23T00:00:00Z")
    if obj["kind"] == "Service":
        stored["spec"].update(type="ClusterIP", sessionAffinity="None", ipFamilies=["IPv4"])
        stored["spec"].setdefault("clusterIP", "10.96.0.12")
    return stored


def test_nothing_to_patch_when_only_server_fields_differ():
    for want in (manifests.master_service("orders", "shop"), manifests.headless_service("orders", "shop"),
                 manifests.service_account("orders", "shop"), manifests.pod_disruption_budget("orders", "shop", 3),
                 manifests.config_map("orders", "shop", {})):
        want = built(want)
        assert drift.repair(as_stored(want), want) is None, want["kind"]


def test_an_edited_master_selector_is_put_back_exactly():
    want = built(manifests.master_service("orders", "shop"))
    edited = as_stored(want)
    edited["spec"]["selector"]["txbroker.dev/role"] = "slave"
    edited["spec"]["selector"]["extra"] = "x"
    patch = drift.repair(edited, want)
    assert patch == {"spec": {"selector": {"txbroker.dev/role": "master", "extra": None}}}
    assert drift.what(patch) == "spec.selector"


def test_edited_ports_are_replaced_whole():
    want = built(manifests.master_service("orders", "shop"))
    edited = as_stored(want)
    edited["spec"]["ports"][0]["port"] = 9999
    assert drift.repair(edited, want) == {"spec": {"ports": want["spec"]["ports"]}}


def test_labels_others_add_stay_and_ours_come_back():
    want = built(manifests.service_account("orders", "shop"))
    edited = as_stored(want)
    edited["metadata"]["labels"]["team"] = "payments"
    del edited["metadata"]["labels"]["txbroker.dev/broker"]
    edited["automountServiceAccountToken"] = True
    patch = drift.repair(edited, want)
    assert patch == {"metadata": {"labels": {"txbroker.dev/broker": "orders"}}, "automountServiceAccountToken": False}


def test_a_lost_owner_reference_is_added_back_beside_the_others():
    want = built(manifests.headless_service("orders", "shop"))
    edited = as_stored(want)
    someone = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-2"}
    edited["metadata"]["ownerReferences"] = [someone]
    assert drift.repair(edited, want) == {"metadata": {"ownerReferences": [someone, OWNER]}}


def test_a_pod_disruption_budget_edited_to_max_unavailable_gets_its_budget_back():
    """(also what an operator before 0.2.0 made: maxUnavailable 1, which refuses every eviction of
    pods whose controller has no scale the disruption controller can read)"""
    want = built(manifests.pod_disruption_budget("orders", "shop", 3))
    edited = as_stored(want)
    del edited["spec"]["minAvailable"]
    edited["spec"]["maxUnavailable"] = 1
    patch = drift.repair(edited, want)
    assert patch == {"spec": {"minAvailable": 2, "maxUnavailable": None}}


def test_config_map_data_follows_exactly():
    want = built(manifests.config_map("orders", "shop", {"replication": "SYNC"}))
    edited = as_stored(want)
    edited["data"] = {"broker.toml": "tampered", "other.toml": ""}
    assert drift.repair(edited, want) == {"data": {"broker.toml": want["data"]["broker.toml"], "other.toml": None}}
