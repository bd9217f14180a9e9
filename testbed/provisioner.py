"""The testbed node's PersistentVolume provisioner (testbed/cluster.sh starts it): a local-path
provisioner, as kind and k3s ship, for the StorageClass `local-path` (provisioner
`txbroker.dev/local-path`, WaitForFirstConsumer).

For each claim of that class that the scheduler has placed on this node (the
`volume.kubernetes.io/selected-node` annotation), it makes a directory under --volumes and a
hostPath PersistentVolume bound to the claim; the controller manager's volume controller finishes
the binding. When a claim is deleted, its volume is Released: the volume and its directory go
(reclaimPolicy Delete). The directory is world-writable, as local-path-provisioner makes it, so a
pod's non-root user can write there.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

PROVISIONER = "txbroker.dev/local-path"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
log = logging.getLogger("provisioner")


class Provisioner:
    def __init__(self, api: client.CoreV1Api, storage: client.StorageV1Api, volumes: Path, node: str):
        self.api, self.storage, self.volumes, self.node = api, storage, volumes, node

    def our_classes(self) -> set[str]:
        return {sc.metadata.name for sc in self.storage.list_storage_class().items
                if sc.provisioner == PROVISIONER}

    def provision(self, pvc: client.V1PersistentVolumeClaim) -> None:
        meta = pvc.metadata
        if pvc.status.phase != "Pending" or pvc.spec.volume_name:
            return
        if pvc.spec.storage_class_name not in self.our_classes():
            return
        if (meta.annotations or {}).get(SELECTED_NODE) != self.node:
            return   # WaitForFirstConsumer: the scheduler has not placed its pod yet
        name = f"pvc-{meta.uid}"
        path = self.volumes / f"{meta.namespace}_{meta.name}_{name}"
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        pv = client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=name, annotations={
                "pv.kubernetes.io/provisioned-by": PROVISIONER}),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": pvc.spec.resources.requests["storage"]},
                access_modes=pvc.spec.access_modes,
                persistent_volume_reclaim_policy="Delete",
                storage_class_name=pvc.spec.storage_class_name,
                volume_mode=pvc.spec.volume_mode,
                host_path=client.V1HostPathVolumeSource(path=str(path), type="DirectoryOrCreate"),
                claim_ref=client.V1ObjectReference(kind="PersistentVolumeClaim", namespace=meta.namespace,
                                                   name=meta.name, uid=meta.uid),
                node_affinity=client.V1VolumeNodeAffinity(required=client.V1NodeSelector(
                    node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=[
                        client.V1NodeSelectorRequirement(key="kubernetes.io/hostname", operator="In",
                                                         values=[self.node])])]))))
        try:
            self.api.create_persistent_volume(pv)
            log.info("provisioned %s for %s/%s at %s", name, meta.namespace, meta.name, path)
        except ApiException as e:
            if e.status != 409:   # already made on an earlier event
                raise

    def reclaim(self, pv: client.V1PersistentVolume) -> None:
        annotations = pv.metadata.annotations or {}
        if annotations.get("pv.kubernetes.io/provisioned-by") != PROVISIONER or pv.status.phase != "Released":
            return
        path = Path(pv.spec.host_path.path)
        if path.parent == self.volumes:   # only ever delete what we made
            shutil.rmtree(path, ignore_errors=True)
        try:
            self.api.delete_persistent_volume(pv.metadata.name)
            log.info("deleted %s (%s)", pv.metadata.name, path)
        except ApiException as e:
            if e.status != 404:
                raise

    def run(self) -> None:
        # two watches in turn would miss events: poll both with a watch on claims, and a full
        # list of volumes after each event or timeout (a one-node testbed has a handful)
        while True:
            try:
                for pv in self.api.list_persistent_volume().items:
                    self.reclaim(pv)
                for event in watch.Watch().stream(self.api.list_persistent_volume_claim_for_all_namespaces,
                                                  timeout_seconds=2):
                    self.provision(event["object"])
            except Exception:   # noqa: BLE001 - the API server restarting, say: keep going
                log.exception("provisioner loop failed; retrying")
                time.sleep(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True, help="credentials for the API server")
    ap.add_argument("--volumes", required=True, type=Path, help="directory the volumes are made in")
    ap.add_argument("--node", required=True, help="this node's name: volumes are made for claims placed on it")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config.load_kube_config(args.kubeconfig)
    args.volumes.mkdir(parents=True, exist_ok=True)
    Provisioner(client.CoreV1Api(), client.StorageV1Api(), args.volumes.resolve(), args.node).run()


if __name__ == "__main__":
    main()
