"""Pure builders: a TxBroker's name, namespace and spec in, plain manifest dicts out.

No API calls here, so these are unit-testable and reusable by later features (rolling updates,
failover relabelling).
"""

from __future__ import annotations

from typing import Any, Mapping

from . import constants as c


def pod_name(broker: str, index: int) -> str:
    return f"{broker}-{index}"


def headless_service_name(broker: str) -> str:
    return broker


def master_service_name(broker: str) -> str:
    return f"{broker}-master"


def pvc_name(broker: str, index: int) -> str:
    return f"data-{pod_name(broker, index)}"


def selector_labels(broker: str) -> dict[str, str]:
    return {c.LABEL_NAME: "txbroker", c.LABEL_INSTANCE: broker, c.LABEL_BROKER: broker}


def common_labels(broker: str) -> dict[str, str]:
    return {**selector_labels(broker), c.LABEL_MANAGED_BY: c.MANAGED_BY}


def broker_address(host: str) -> str:
    return f"{host}:{c.CLIENT_PORT}"


def broker_args(role: str, master_address: str | None, spec: Mapping[str, Any] | None = None,
                name: str | None = None) -> list[str]:
    """`txbroker broker` flags: the contract (--data-dir --listen --admin-listen --role [--master]),
    then the TxBroker's replication, flush and transaction settings."""
    args = ["broker", "--data-dir", c.DATA_DIR,
            "--listen", f"$(POD_IP):{c.CLIENT_PORT}",
            "--admin-listen", f"$(POD_IP):{c.ADMIN_PORT}",
            "--role", role]
    if role == c.ROLE_SLAVE:
        if not master_address:
            raise ValueError("a slave needs the master's address")
        args += ["--master", master_address]
    if name:
        args += ["--broker-name", name]
    if spec is not None:
        tx = spec.get("transaction") or {}
        args += ["--replication-mode", spec.get("replication", "ASYNC"),
                 "--flush-disk-type", spec.get("flush", "ASYNC"),
                 "--check-interval-ms", str(int(tx.get("checkIntervalSeconds", 60)) * 1000),
                 "--transaction-timeout-ms", str(int(tx.get("timeoutSeconds", 6)) * 1000),
                 "--check-max", str(int(tx.get("checkMax", 15)))]
    return args


def broker_pod(name: str, namespace: str, spec: Mapping[str, Any], index: int,
               master_address: str | None = None) -> dict:
    """Pod `<name>-<index>`: index 0 starts as master, the others as slaves of `master_address`."""
    role = c.ROLE_MASTER if index == 0 else c.ROLE_SLAVE
    tmpl = spec.get("podTemplate") or {}
    labels = {**(tmpl.get("labels") or {}), **common_labels(name),
              c.LABEL_COMPONENT: "broker", c.LABEL_ROLE: role, c.LABEL_INDEX: str(index)}
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    container: dict[str, Any] = {
        "name": c.CONTAINER_NAME,
        "image": spec["image"],
        "imagePullPolicy": spec.get("imagePullPolicy", "IfNotPresent"),
        "command": ["txbroker"],
        "args": broker_args(role, master_address, spec, pod_name(name, index)),
        "env": env,
        "ports": [{"name": "client", "containerPort": c.CLIENT_PORT, "protocol": "TCP"},
                  {"name": "admin", "containerPort": c.ADMIN_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": c.ADMIN_PORT},
                           "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 3},
        "volumeMounts": [{"name": "data", "mountPath": c.DATA_DIR}],
    }
    if spec.get("resources"):
        container["resources"] = dict(spec["resources"])
    if spec.get("storage"):
        data_volume = {"name": "data", "persistentVolumeClaim": {"claimName": pvc_name(name, index)}}
    else:
        data_volume = {"name": "data", "emptyDir": {}}
    pod_spec: dict[str, Any] = {
        "hostname": pod_name(name, index),
        "subdomain": headless_service_name(name),
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "containers": [container],
        "volumes": [data_volume],
    }
    for key in ("nodeSelector", "tolerations", "affinity"):
        if tmpl.get(key):
            pod_spec[key] = tmpl[key]
    meta: dict[str, Any] = {"name": pod_name(name, index), "namespace": namespace, "labels": labels}
    if tmpl.get("annotations"):
        meta["annotations"] = dict(tmpl["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def data_pvc(name: str, namespace: str, spec: Mapping[str, Any], index: int) -> dict:
    storage = spec["storage"]
    pvc_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": storage["size"]}}}
    if storage.get("storageClassName"):
        pvc_spec["storageClassName"] = storage["storageClassName"]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": pvc_name(name, index), "namespace": namespace,
                         "labels": {**common_labels(name), c.LABEL_INDEX: str(index)}},
            "spec": pvc_spec}


def _ports() -> list[dict]:
    return [{"name": "client", "port": c.CLIENT_PORT, "targetPort": "client", "protocol": "TCP"},
            {"name": "admin", "port": c.ADMIN_PORT, "targetPort": "admin", "protocol": "TCP"}]


def headless_service(name: str, namespace: str) -> dict:
    """Stable DNS for every broker pod: <name>-<i>.<name>.<namespace>.svc."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": headless_service_name(name), "namespace": namespace,
                         "labels": common_labels(name)},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": selector_labels(name), "ports": _ports()}}


def master_service(name: str, namespace: str) -> dict:
    """Follows whichever pod carries the master role label (failover relabels pods)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": master_service_name(name), "namespace": namespace,
                         "labels": common_labels(name)},
            "spec": {"selector": {**selector_labels(name), c.LABEL_ROLE: c.ROLE_MASTER},
                     "ports": _ports()}}
