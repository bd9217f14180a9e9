"""Pure builders: a TxBroker's name, namespace and spec in, plain manifest dicts out.

No API calls here, so these are unit-testable; reconcile.py decides what to create or change.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from . import constants as c


def group_name(group: int) -> str:
    """A broker group's name, as pods, Services, the route and the brokers (`--group`) say it."""
    return f"g{group}"


def group_index(name: str) -> int:
    """The index in a group_name(); -1 for a name no operator gives."""
    return int(name[1:]) if len(name) > 1 and name[0] == "g" and name[1:].isdigit() else -1


def pod_name(broker: str, index: int, group: int = 0) -> str:
    """Group g0 keeps the names of a TxBroker without groups (`<name>-<i>`), so scaling out never
    renames a running broker; group g<k> (k >= 1) is `<name>-g<k>-<i>`."""
    return f"{broker}-{index}" if group == 0 else f"{broker}-g{group}-{index}"


def pod_index(pod: str) -> int:
    """The index in a pod_name()."""
    return int(pod.rsplit("-", 1)[1])


def headless_service_name(broker: str) -> str:
    """Every broker pod's DNS subdomain, whatever its group: <pod>.<name>.<namespace>.svc, so one
    certificate (*.<name>.<namespace>.svc) serves every group. A group has no Service of its own:
    the route names its brokers, the txbroker.dev/group label selects them, and removing one would
    need the right to delete Services, which the operator does without."""
    return broker


def master_service_name(broker: str) -> str:
    """The bootstrap Service: every group's master (one group: the master, as before groups)."""
    return f"{broker}-master"


def config_map_name(broker: str) -> str:
    return f"{broker}-config"


def route_config_map_name(broker: str) -> str:
    return f"{broker}-route"


def service_account_name(broker: str) -> str:
    return f"{broker}-broker"


def pvc_name(broker: str, index: int, group: int = 0) -> str:
    return f"data-{pod_name(broker, index, group)}"


def selector_labels(broker: str) -> dict[str, str]:
    return {c.LABEL_NAME: "txbroker", c.LABEL_INSTANCE: broker, c.LABEL_BROKER: broker}


def group_selector_labels(broker: str, group: int) -> dict[str, str]:
    return {**selector_labels(broker), c.LABEL_GROUP: group_name(group)}


def common_labels(broker: str) -> dict[str, str]:
    return {**selector_labels(broker), c.LABEL_MANAGED_BY: c.MANAGED_BY}


def pod_address(broker: str, namespace: str, pod: str) -> str:
    """A broker's stable client address (the headless Service's DNS), as the route lists it."""
    return f"{pod}.{headless_service_name(broker)}.{namespace}.svc:{c.CLIENT_PORT}"


def broker_address(host: str) -> str:
    return f"{host}:{c.CLIENT_PORT}"


def transaction_settings(spec: Mapping[str, Any]) -> dict[str, int]:
    """spec.transaction as the broker's [transaction] settings (milliseconds)."""
    tx = spec.get("transaction") or {}
    return {"check_interval_ms": int(tx.get("checkIntervalSeconds", 60)) * 1000,
            "timeout_ms": int(tx.get("timeoutSeconds", 6)) * 1000,
            "check_max": int(tx.get("checkMax", 15))}


def broker_toml(spec: Mapping[str, Any]) -> str:
    """The broker's config file. Transaction defaults are also pushed live through the admin API, so
    a change to them reaches running brokers at once and restarted ones through this file."""
    retention = spec.get("retention") or {}
    lines = [f'replication_mode = "{spec.get("replication", "ASYNC")}"',
             f'flush_disk_type = "{spec.get("flush", "ASYNC")}"',
             f'retention_ms = {int(retention.get("hours", 72)) * 3_600_000}',
             f'retention_bytes = {int(retention.get("bytes", 0))}']
    if "jobHours" in retention:  # else the broker's default (7 days): no line, so older specs keep their pods
        lines.append(f'job_retention_ms = {int(retention["jobHours"]) * 3_600_000}')
    if "idlePollMicroseconds" in spec:  # likewise (the broker's default, 200 us)
        lines.append(f'idle_poll_us = {int(spec["idlePollMicroseconds"])}')
    lines += ["", "[transaction]"]
    lines += [f"{k} = {v}" for k, v in transaction_settings(spec).items()]
    return "\n".join(lines) + "\n"


def config_map(name: str, namespace: str, spec: Mapping[str, Any]) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_map_name(name), "namespace": namespace, "labels": common_labels(name)},
            "data": {c.CONFIG_FILE: broker_toml(spec)}}


# Raised when what the operator builds changes in a way running pods must follow: pods built before
# broker groups have no route mounted, and are replaced once (a rolling update) to get it.
POD_LAYOUT = 2


def pod_spec_hash(spec: Mapping[str, Any]) -> str:
    """What a running pod cannot pick up without a restart. Transaction defaults are left out: they
    are applied live; so are spec.groups and replicas (the route file is reloaded by the brokers)."""
    relevant: dict[str, Any] = {k: spec.get(k) for k in ("image", "imagePullPolicy", "replication", "flush", "retention",
                                                         "resources", "podTemplate", "storage", "authSecretRef", "tls")}
    relevant["layout"] = POD_LAYOUT
    if "idlePollMicroseconds" in spec:  # (only when given: a spec without it keeps its pods' hash)
        relevant["idlePollMicroseconds"] = spec["idlePollMicroseconds"]
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


AUTH_DIR = f"{c.CONFIG_DIR}/auth"
TERMINATION_GRACE_S = 30
STOP_HANDOVER_WAIT_MS = 20_000   # within the grace period, leaving the broker 10 s to stop
TLS_DIR = f"{c.CONFIG_DIR}/tls"


def broker_args(spec: Mapping[str, Any] | None = None, name: str = "", namespace: str = "",
                group: int = 0) -> list[str]:
    """`txbroker broker` flags. Role and master come from the pod's own label and annotation (see
    constants.ANNOTATION_MASTER); the group from the pod and the cluster route from the mounted
    `<name>-route` ConfigMap (the broker reloads it when it changes, so a scale-out or a draining
    group reaches running brokers without a restart); everything else from the ConfigMap's
    broker.toml, and the credentials and certificates from the mounted Secrets (security.py lists
    their keys)."""
    spec = spec or {}
    args = ["broker", "--config", f"{c.CONFIG_DIR}/{c.CONFIG_FILE}",
            "--data-dir", c.DATA_DIR,
            "--listen", f"$(POD_IP):{c.CLIENT_PORT}",
            "--admin-listen", f"$(POD_IP):{c.ADMIN_PORT}",
            "--broker-name", "$(POD_NAME)",
            "--role", "$(TXBROKER_ROLE)",
            "--master", "$(TXBROKER_MASTER)",
            "--group", group_name(group),
            "--cluster-file", f"{c.ROUTE_DIR}/{c.ROUTE_FILE}"]
    if spec.get("authSecretRef"):
        args += ["--auth-file", f"{AUTH_DIR}/credentials.toml",
                 "--replication-access-key", "$(TXBROKER_REPLICATION_ACCESS_KEY)",
                 "--replication-secret-file", f"{AUTH_DIR}/replication-secret"]
    tls = spec.get("tls") or {}
    if tls.get("secretRef"):
        args += ["--tls-cert", f"{TLS_DIR}/tls.crt", "--tls-key", f"{TLS_DIR}/tls.key",
                 "--tls-ca", f"{TLS_DIR}/ca.crt", "--tls-server-name", f"{name}.{namespace}.svc"]
        if tls.get("requireClientCertificates"):
            args += ["--tls-client-ca", f"{TLS_DIR}/ca.crt"]
    return args


def _field_env(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


RESTORE_MOUNT = "/restore"
RESTORE_CONTAINER = "restore"


def broker_pod(name: str, namespace: str, spec: Mapping[str, Any], index: int, role: str,
               master_address: str = "", group: int = 0, restore_from: str | None = None) -> dict:
    """Pod `index` of broker group `group` (pod_name()) in `role`; a slave replicates from
    `master_address`, a broker of its own group. `restore_from`: a path in spec.restore's claim; the
    pod first restores the backup there into its data directory (restore.py)."""
    tmpl = spec.get("podTemplate") or {}
    labels = {**(tmpl.get("labels") or {}), **common_labels(name), c.LABEL_COMPONENT: "broker",
              c.LABEL_ROLE: role, c.LABEL_INDEX: str(index), c.LABEL_GROUP: group_name(group)}
    annotations = {**(tmpl.get("annotations") or {}),
                   c.ANNOTATION_MASTER: "" if role == c.ROLE_MASTER else master_address,
                   c.ANNOTATION_POD_SPEC: pod_spec_hash(spec)}
    env = [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("POD_IP", "status.podIP"),
        _field_env("TXBROKER_ROLE", f"metadata.labels['{c.LABEL_ROLE}']"),
        _field_env("TXBROKER_MASTER", f"metadata.annotations['{c.ANNOTATION_MASTER}']"),
        # a master whose pod is deleted (a drain) serves on while the operator switches over; an
        # environment variable, not a flag: a broker before 0.2.0 ignores it (a flag would stop it)
        {"name": "TXBROKER_STOP_HANDOVER_WAIT_MS", "value": str(STOP_HANDOVER_WAIT_MS)},
        # a master restarted in its pod takes no write until this operator confirms it (its role label
        # may predate a failover it missed); an environment variable for the same reason
        {"name": "TXBROKER_AWAIT_ROLE_CONFIRMATION", "value": "1"},
    ]
    container: dict[str, Any] = {
        "name": c.CONTAINER_NAME,
        "image": spec["image"],
        "imagePullPolicy": spec.get("imagePullPolicy", "IfNotPresent"),
        "command": ["txbroker"],
        "args": broker_args(spec, name, namespace, group),
        "env": env,
        "ports": [{"name": "client", "containerPort": c.CLIENT_PORT, "protocol": "TCP"},
                  {"name": "admin", "containerPort": c.ADMIN_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": c.ADMIN_PORT},
                           "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": c.ADMIN_PORT},
                          "initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 2,
                          "failureThreshold": 6},
        "volumeMounts": [{"name": "data", "mountPath": c.DATA_DIR},
                         {"name": "config", "mountPath": c.CONFIG_DIR, "readOnly": True},
                         {"name": "route", "mountPath": c.ROUTE_DIR, "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    if spec.get("resources"):
        container["resources"] = dict(spec["resources"])
    volumes = []
    if spec.get("authSecretRef"):
        secret = spec["authSecretRef"]["name"]
        env.append({"name": "TXBROKER_REPLICATION_ACCESS_KEY", "valueFrom": {"secretKeyRef": {
            "name": secret, "key": "replication-access-key", "optional": True}}})
        volumes.append({"name": "auth", "secret": {"secretName": secret, "defaultMode": 0o400, "items": [
            {"key": "credentials.toml", "path": "credentials.toml"},
            {"key": "replication-secret", "path": "replication-secret"}]}})
        container["volumeMounts"].append({"name": "auth", "mountPath": AUTH_DIR, "readOnly": True})
    if (spec.get("tls") or {}).get("secretRef"):
        volumes.append({"name": "tls", "secret": {"secretName": spec["tls"]["secretRef"]["name"], "defaultMode": 0o400}})
        container["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        for probe in ("readinessProbe", "livenessProbe"):   # probes do not verify certificates
            container[probe]["httpGet"]["scheme"] = "HTTPS"
    if spec.get("storage"):
        data_volume = {"name": "data", "persistentVolumeClaim": {"claimName": pvc_name(name, index, group)}}
    else:
        data_volume = {"name": "data", "emptyDir": {}}
    pod_spec: dict[str, Any] = {
        "hostname": pod_name(name, index, group),
        "subdomain": headless_service_name(name),
        "serviceAccountName": service_account_name(name),
        "automountServiceAccountToken": False,   # brokers never call the Kubernetes API
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001,   # the image's user
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [data_volume, {"name": "config", "configMap": {"name": config_map_name(name)}},
                    {"name": "route", "configMap": {"name": route_config_map_name(name)}}, *volumes],
    }
    if restore_from is not None:
        pod_spec["initContainers"] = [restore_step(container, restore_from)]
        pod_spec["volumes"].append({"name": RESTORE_CONTAINER, "persistentVolumeClaim": {
            "claimName": spec["restore"]["claimName"], "readOnly": True}})
    for key in ("nodeSelector", "tolerations", "affinity"):
        if tmpl.get(key):
            pod_spec[key] = tmpl[key]
    meta = {"name": pod_name(name, index, group), "namespace": namespace, "labels": labels, "annotations": annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def restore_step(broker: Mapping[str, Any], path: str) -> dict:
    """The init container that restores a backup (`txbroker backup restore`) into the data directory,
    with the broker container's image and security context, the backup's claim read-only; it passes
    over a directory it restored already (a restarted pod), and refuses any other content."""
    return {
        "name": RESTORE_CONTAINER,
        "image": broker["image"],
        "imagePullPolicy": broker["imagePullPolicy"],
        "command": ["txbroker"],
        "args": ["backup", "restore", "--from", f"{RESTORE_MOUNT}/{path}".rstrip("/"), "--data-dir", c.DATA_DIR,
                 "--if-not-restored"],
        "volumeMounts": [{"name": "data", "mountPath": c.DATA_DIR},
                         {"name": RESTORE_CONTAINER, "mountPath": RESTORE_MOUNT, "readOnly": True}],
        "securityContext": dict(broker["securityContext"]),
        "terminationMessagePolicy": "FallbackToLogsOnError",   # the command's refusal, in the pod's status
    }


def data_pvc(name: str, namespace: str, spec: Mapping[str, Any], index: int, group: int = 0) -> dict:
    storage = spec["storage"]
    pvc_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": storage["size"]}}}
    if storage.get("storageClassName"):
        pvc_spec["storageClassName"] = storage["storageClassName"]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": pvc_name(name, index, group), "namespace": namespace,
                         "labels": {**common_labels(name), c.LABEL_INDEX: str(index), c.LABEL_GROUP: group_name(group)}},
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
    """Follows whichever pods carry the master role label (failover relabels pods): the master of
    every group, so it is the one bootstrap address of a TxBroker of many groups (clients fetch the
    route from whichever master answers)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": master_service_name(name), "namespace": namespace,
                         "labels": common_labels(name)},
            "spec": {"selector": {**selector_labels(name), c.LABEL_ROLE: c.ROLE_MASTER},
                     "ports": _ports()}}


def route_config_map(name: str, namespace: str, document: str) -> dict:
    """The cluster route (route.py renders `document`), mounted into every broker pod."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": route_config_map_name(name), "namespace": namespace, "labels": common_labels(name)},
            "data": {c.ROUTE_FILE: document}}


def service_account(name: str, namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": service_account_name(name), "namespace": namespace, "labels": common_labels(name)},
            "automountServiceAccountToken": False}


def pdb_name(broker: str, group: int = 0) -> str:
    """A broker group's PodDisruptionBudget: `<name>` for g0 (as before groups), `<name>-gK`."""
    return broker if group == 0 else f"{broker}-g{group}"


def pod_disruption_budget(name: str, namespace: str, replicas: int, group: int = 0) -> dict:
    """Voluntary evictions (node drains) take one broker of a group at a time: the group keeps a
    master and (with 3 replicas) a slave in sync, so it stays writable; a master evicted hands over
    first (a switchover: the broker serves on after SIGTERM until the operator has moved mastership).
    minAvailable replicas - 1, not maxUnavailable 1: the disruption controller counts the pods a
    maxUnavailable allows for from their controller's scale, and a TxBroker's pods have none it can
    read (InsufficientPods: every eviction refused, as for bare pods)."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": pdb_name(name, group), "namespace": namespace,
                         "labels": {**common_labels(name), c.LABEL_GROUP: group_name(group)}},
            "spec": {"minAvailable": max(replicas - 1, 1),
                     "selector": {"matchLabels": group_selector_labels(name, group)}}}


def network_policy(name: str, namespace: str, spec: Mapping[str, Any], operator_namespace: str) -> dict:
    """Only labelled clients reach the data plane; brokers reach each other (replication); the
    admin plane is open to the operator's namespace (and probes, which come from the node)."""
    np = spec.get("networkPolicy") or {}
    clients = np.get("clientLabels") or {"txbroker.dev/client": name}
    peers = {"podSelector": {"matchLabels": selector_labels(name)}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace, "labels": common_labels(name)},
            "spec": {"podSelector": {"matchLabels": selector_labels(name)}, "policyTypes": ["Ingress"],
                     "ingress": [
                         {"from": [{"podSelector": {"matchLabels": clients}}, peers],
                          "ports": [{"protocol": "TCP", "port": c.CLIENT_PORT}]},
                         {"from": [peers, {"namespaceSelector": {"matchLabels": {
                             "kubernetes.io/metadata.name": operator_namespace}}}],
                          "ports": [{"protocol": "TCP", "port": c.ADMIN_PORT}]},
                     ]}}
