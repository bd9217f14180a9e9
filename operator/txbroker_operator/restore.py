"""spec.restore: a new TxBroker whose broker groups start from backups (`txbroker backup create`,
docs/backup.md), instead of empty.

Each group's first master pod gets an init container that runs `txbroker backup restore` from the
claim `spec.restore.claimName` (mounted read-only) into the pod's data directory; the broker starts
only once it succeeded, on the restored store, as master; its slaves copy it from there as any new
slave does. The restore command refuses, before writing anything, a data directory that is not
empty, a damaged backup or a store format the image cannot read; the init container then fails,
the broker never starts, and the operator says why (condition Restored, Event RestoreRefused).

A restore goes into a new TxBroker only: spec.restore added to one that already runs brokers is
refused here (status and Event), and nothing is restarted or replaced. Whether it is new is decided
once, at the first pass that sees spec.restore, and kept in status.restore: the init container is
built only while that says Restoring, so a pod created after the restore (a failover's returning
pod) starts as any other. `--if-not-restored` lets a restarted pod's init container pass over its
own restore. spec.restore is not part of the pod spec hash: adding or removing it rolls nothing.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import manifests
from .observe import Member

RESTORING, RESTORED, REFUSED = "Restoring", "Restored", "Refused"
INIT_CONTAINER = manifests.RESTORE_CONTAINER


def path_in_claim(spec: Mapping[str, Any], group: str) -> str:
    """The backup's directory in the claim for broker group `group` ("{group}" in the path is its name)."""
    return str((spec.get("restore") or {}).get("path") or "").replace("{group}", group).strip("/")


def source(spec: Mapping[str, Any], group: str) -> str:
    r = spec.get("restore") or {}
    return f"{r.get('claimName')}:/{path_in_claim(spec, group)}"


def begin(spec: Mapping[str, Any], status: Mapping[str, Any], has_pods: bool, now: str) -> dict | None:
    """status.restore to record at the first pass that sees spec.restore (None: nothing to record)."""
    if not spec.get("restore") or status.get("restore"):
        return None
    what = f"claim {spec['restore'].get('claimName')}, path /{path_in_claim(spec, '{group}')}"
    if has_pods or status.get("groups") or status.get("master"):
        return {"phase": REFUSED, "source": what, "time": now,
                "message": "spec.restore was set on a TxBroker that already runs brokers: a backup is restored "
                           "only into a new TxBroker (create one with spec.restore); nothing was restored, "
                           "restarted or replaced"}
    return {"phase": RESTORING, "source": what, "time": now,
            "message": "each broker group's first master starts from its backup"}


def active(status: Mapping[str, Any]) -> bool:
    """Pods built now get the restore step (only while the new TxBroker's restore is under way)."""
    return (status.get("restore") or {}).get("phase") == RESTORING


def refusal(member: Member | None) -> str:
    """Why the restore step of this master's pod failed ("" if it did not): the command's own words,
    which the kubelet keeps as the container's termination message."""
    if member is None:
        return ""
    for st in (member.pod.get("status") or {}).get("initContainerStatuses") or []:
        if st.get("name") != INIT_CONTAINER:
            continue
        for state in (st.get("state") or {}, st.get("lastState") or {}):
            done = state.get("terminated") or {}
            if done.get("exitCode"):
                return (done.get("message") or done.get("reason") or f"exit code {done['exitCode']}").strip()
    return ""


def condition(restore: Mapping[str, Any] | None) -> tuple[bool, str, str] | None:
    """The condition Restored (status, reason, message), while status.restore exists."""
    if not restore:
        return None
    phase = restore.get("phase")
    if phase == RESTORED:
        return True, "Restored", restore.get("message", "")
    refused = phase == REFUSED or bool(restore.get("refused"))
    return False, "RestoreRefused" if refused else "Restoring", restore.get("refused") or restore.get("message", "")
