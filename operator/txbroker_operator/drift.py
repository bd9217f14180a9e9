"""Pure: the merge patch that puts an owned child back the way the operator builds it (drift repair).

Only what the operator sets is compared: its labels, its owner reference and, per kind, the fields
the brokers depend on (a Service's selector and ports, a PodDisruptionBudget's budget and selector,
a ServiceAccount's token setting, a ConfigMap's data). Anything else - fields the API server fills in
(a Service's clusterIP), labels or annotations others add - is left alone. Maps the operator owns
outright (a selector, ConfigMap data) are restored exactly: keys someone added are removed (null in a
merge patch); lists are replaced whole, as merge patches do.
"""

from __future__ import annotations

from typing import Any, Mapping

_PORT_FIELDS = ("name", "port", "targetPort", "protocol")


def exact_map(current: Mapping[str, Any] | None, want: Mapping[str, Any]) -> dict:
    """Merge patch turning map `current` into exactly `want`."""
    current = current or {}
    patch = {k: v for k, v in want.items() if current.get(k) != v}
    patch.update({k: None for k in current if k not in want})
    return patch


def _ports(ports: list[dict] | None) -> list[dict]:
    return [{k: p.get(k) for k in _PORT_FIELDS} for p in ports or []]


def _spec_patch(kind: str, have: Mapping[str, Any], want: Mapping[str, Any]) -> dict:
    patch: dict[str, Any] = {}
    if kind == "Service":
        if selector := exact_map(have.get("selector"), want["selector"]):
            patch["selector"] = selector
        if _ports(have.get("ports")) != _ports(want["ports"]):
            patch["ports"] = want["ports"]
        if have.get("publishNotReadyAddresses", False) != want.get("publishNotReadyAddresses", False):
            patch["publishNotReadyAddresses"] = want.get("publishNotReadyAddresses", False)
    elif kind == "PodDisruptionBudget":
        if have.get("minAvailable") != want["minAvailable"]:
            patch["minAvailable"] = want["minAvailable"]
        if "maxUnavailable" in have:   # the two are exclusive; ours is minAvailable (manifests.py says why)
            patch["maxUnavailable"] = None
        selector = (have.get("selector") or {})
        if selector.get("matchLabels") != want["selector"]["matchLabels"] or selector.get("matchExpressions"):
            patch["selector"] = {"matchLabels": exact_map(selector.get("matchLabels"), want["selector"]["matchLabels"]),
                                 "matchExpressions": None}
    elif have != want:   # e.g. NetworkPolicy: the operator builds the whole spec
        patch = dict(want)
    return patch


def repair(current: Mapping[str, Any], want: Mapping[str, Any]) -> dict | None:
    """A merge patch for `current` (as read from the API) so it matches `want` (as built, adopted);
    None when nothing the operator owns has drifted."""
    patch: dict[str, Any] = {}
    meta, want_meta = current.get("metadata") or {}, want.get("metadata") or {}
    labels = {k: v for k, v in (want_meta.get("labels") or {}).items() if (meta.get("labels") or {}).get(k) != v}
    if labels:
        patch.setdefault("metadata", {})["labels"] = labels
    refs = meta.get("ownerReferences") or []
    missing = [r for r in want_meta.get("ownerReferences") or [] if all(x.get("uid") != r.get("uid") for x in refs)]
    if missing:   # a list: the patch carries the whole of it
        patch.setdefault("metadata", {})["ownerReferences"] = refs + missing
    kind = want["kind"]
    if kind == "ConfigMap":
        if data := exact_map(current.get("data"), want.get("data") or {}):
            patch["data"] = data
    elif kind == "ServiceAccount":
        if current.get("automountServiceAccountToken") != want.get("automountServiceAccountToken"):
            patch["automountServiceAccountToken"] = want.get("automountServiceAccountToken")
    elif "spec" in want:
        if spec := _spec_patch(kind, current.get("spec") or {}, want["spec"]):
            patch["spec"] = spec
    return patch or None


def what(patch: Mapping[str, Any]) -> str:
    """The drifted fields a patch puts back, for logs and Events: `spec.selector, metadata.labels`."""
    return ", ".join(f"{top}.{k}" if isinstance(v, dict) else top
                     for top, v in patch.items() for k in (v if isinstance(v, dict) else [None]))
