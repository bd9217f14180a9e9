"""What the operator builds for a TxBroker: broker pods (with the spec's pod template, resources and
storage) and their PersistentVolumeClaims."""

from __future__ import annotations

from txbroker_operator import manifests

SPEC = {"image": "txbroker/broker:1.0"}


def pod(spec=None, index=0, role="master", master=""):
    return manifests.broker_pod("orders", "shop", {**SPEC, **(spec or {})}, index, role, master)


def test_pod_identity_and_role():
    p = pod(index=2, role="slave", master="10.0.0.1:10911")
    meta = p["metadata"]
    assert (meta["name"], meta["namespace"]) == ("orders-2", "shop")
    assert meta["labels"]["txbroker.dev/role"] == "slave" and meta["labels"]["txbroker.dev/index"] == "2"
    assert meta["annotations"]["txbroker.dev/master-address"] == "10.0.0.1:10911"
    assert p["spec"]["hostname"] == "orders-2" and p["spec"]["subdomain"] == "orders"
    assert p["spec"]["containers"][0]["image"] == "txbroker/broker:1.0"


def test_pod_template_labels_and_annotations_are_added_but_never_override_the_operators():
    p = pod({"podTemplate": {
        "labels": {"team": "payments", "txbroker.dev/role": "slave", "app.kubernetes.io/instance": "other"},
        "annotations": {"prometheus.io/scrape": "true", "txbroker.dev/master-address": "1.2.3.4:10911"}}})
    labels, annotations = p["metadata"]["labels"], p["metadata"]["annotations"]
    assert labels["team"] == "payments"
    # the role label selects the <name>-master Service and the instance label the pods: ours win
    assert labels["txbroker.dev/role"] == "master" and labels["app.kubernetes.io/instance"] == "orders"
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["txbroker.dev/master-address"] == ""     # a master follows no one


def test_pod_template_placement_goes_to_the_pod_spec():
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "mq", "effect": "NoSchedule"}]
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname",
         "labelSelector": {"matchLabels": {"txbroker.dev/broker": "orders"}}}]}}
    p = pod({"podTemplate": {"nodeSelector": {"disktype": "ssd"}, "tolerations": tolerations, "affinity": affinity}})
    assert p["spec"]["nodeSelector"] == {"disktype": "ssd"}
    assert p["spec"]["tolerations"] == tolerations
    assert p["spec"]["affinity"] == affinity


def test_no_placement_fields_without_a_pod_template():
    p = pod()
    assert not {"nodeSelector", "tolerations", "affinity"} & set(p["spec"])


def test_resources_go_to_the_broker_container():
    resources = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    container = pod({"resources": resources})["spec"]["containers"][0]
    assert container["resources"] == resources
    assert "resources" not in pod()["spec"]["containers"][0]


def test_storage_mounts_the_pods_own_claim_and_without_it_an_empty_dir():
    with_storage = pod({"storage": {"size": "10Gi"}}, index=1, role="slave")
    data = next(v for v in with_storage["spec"]["volumes"] if v["name"] == "data")
    assert data == {"name": "data", "persistentVolumeClaim": {"claimName": "data-orders-1"}}
    without = next(v for v in pod()["spec"]["volumes"] if v["name"] == "data")
    assert without == {"name": "data", "emptyDir": {}}
    mount = next(m for m in with_storage["spec"]["containers"][0]["volumeMounts"] if m["name"] == "data")
    assert mount["mountPath"] == "/data"


def test_data_pvc_asks_for_the_size_and_class():
    pvc = manifests.data_pvc("orders", "shop", {**SPEC, "storage": {"size": "10Gi", "storageClassName": "fast"}}, 1)
    assert pvc["kind"] == "PersistentVolumeClaim"
    assert (pvc["metadata"]["name"], pvc["metadata"]["namespace"]) == ("data-orders-1", "shop")
    assert pvc["metadata"]["labels"]["txbroker.dev/index"] == "1"
    assert pvc["metadata"]["labels"]["txbroker.dev/broker"] == "orders"
    assert pvc["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}},
                           "storageClassName": "fast"}


def test_data_pvc_without_a_class_uses_the_clusters_default():
    pvc = manifests.data_pvc("orders", "shop", {**SPEC, "storage": {"size": "1Gi"}}, 0)
    assert "storageClassName" not in pvc["spec"]     # absent, not "": "" would mean no class at all


def test_placement_resources_and_storage_roll_the_pods():
    base = manifests.pod_spec_hash(SPEC)
    for change in ({"podTemplate": {"nodeSelector": {"disktype": "ssd"}}},
                   {"resources": {"limits": {"memory": "2Gi"}}},
                   {"storage": {"size": "1Gi"}}):
        assert manifests.pod_spec_hash({**SPEC, **change}) != base, change


def test_retention_goes_to_the_broker_config_and_rolls_the_pods():
    toml = manifests.broker_toml({"retention": {"hours": 2, "bytes": 5_000_000}})
    assert "retention_ms = 7200000" in toml and "retention_bytes = 5000000" in toml
    assert "job_retention_ms" not in toml  # the broker's default, 7 days
    assert "job_retention_ms = 86400000" in manifests.broker_toml({"retention": {"jobHours": 24}})
    assert "retention_ms = 259200000" in manifests.broker_toml({})  # 72 h, the broker's own default
    assert manifests.pod_spec_hash({"retention": {"hours": 2}}) != manifests.pod_spec_hash({})


def test_the_job_bound_reaches_the_brokers_config_as_the_broker_reads_it(tmp_path):
    from txbroker.broker.config import load_config

    path = tmp_path / "broker.toml"
    path.write_text(manifests.broker_toml({"retention": {"hours": 2, "jobHours": 24}}))
    config = load_config(str(path), {"data_dir": str(tmp_path / "data")})  # the pod gives --data-dir
    assert (config.retention_ms, config.job_retention_ms) == (7_200_000, 86_400_000)


def test_idle_polling_reaches_the_brokers_config_only_when_given(tmp_path):
    from txbroker.broker.config import load_config

    assert "idle_poll_us" not in manifests.broker_toml(SPEC)  # the broker's default, 200 us
    # a TxBroker made before the field keeps its pods: the hash the operator of a16e964 gave SPEC
    assert manifests.pod_spec_hash(SPEC) == "1eef050329aefc9c"
    off = {**SPEC, "idlePollMicroseconds": 0}
    assert manifests.pod_spec_hash(off) != manifests.pod_spec_hash(SPEC)  # a change restarts the brokers
    path = tmp_path / "broker.toml"
    path.write_text(manifests.broker_toml(off))
    assert load_config(str(path), {"data_dir": str(tmp_path / "data")}).idle_poll_us == 0
