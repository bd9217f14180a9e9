"""The periodic pass: every TxBroker and TxProducerGroup the operator has seen, every few seconds.

Events alone cannot notice time passing: a master that stays unreachable past the grace period, a
broker that lost its group settings with its storage, pending counts that changed. Kopf's timers
would do this but put a finalizer on every object, and a TxBroker would then hang in deletion
whenever the operator is down (`helm uninstall` removes both at once). So the operator keeps its own
list of what it has seen (from Kopf's watch events) and walks it on a plain asyncio task.
"""

from __future__ import annotations

import asyncio
import logging
import os

from . import metrics, producer_groups, reconcile

log = logging.getLogger(__name__)

INTERVAL_S = float(os.environ.get("TXBROKER_OPERATOR_RESYNC_SECONDS", "5"))

seen_brokers: set[tuple[str, str]] = set()
seen_groups: set[tuple[str, str]] = set()


def remember(kind_set: set[tuple[str, str]], event_type: str | None, namespace: str, name: str) -> None:
    if event_type == "DELETED":
        kind_set.discard((namespace, name))
    else:
        kind_set.add((namespace, name))


def _broker_pass(namespace: str, name: str) -> None:
    from . import kube
    body = kube.get_txbroker(namespace, name)
    if body is None:
        seen_brokers.discard((namespace, name))
        metrics.forget(namespace, name)
        return
    reconcile.sync(body, log)


def _group_pass(namespace: str, name: str) -> None:
    from . import constants as c
    from . import kube
    body = kube.get(c.TXPRODUCERGROUP_KIND, namespace, name)
    if body is None:
        seen_groups.discard((namespace, name))
        return
    producer_groups.sync_group(body, log)


async def run() -> None:
    log.info("periodic pass every %.1fs", INTERVAL_S)
    while True:
        await asyncio.sleep(INTERVAL_S)
        failed = False
        for fn, keys in ((_broker_pass, seen_brokers), (_group_pass, seen_groups)):
            for namespace, name in sorted(keys):
                try:
                    await asyncio.to_thread(fn, namespace, name)
                except Exception:   # one broken resource must not stop the others' passes
                    failed = True
                    log.exception("periodic pass of %s/%s failed; retrying in %.1fs", namespace, name, INTERVAL_S)
        if not failed:
            metrics.round_done()
