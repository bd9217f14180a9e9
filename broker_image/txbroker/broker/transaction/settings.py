"""Transaction settings: broker defaults plus per-producer-group overrides, both changeable live.

Group overrides are what the operator applies from a TxProducerGroup. They are log records
(GroupSettingsRecord), written on the master only: slaves replay them, a restarted broker reads
them back, and a promoted slave runs them without anyone applying them again. The operator still
re-applies what it finds missing; both write the same whole settings, so they agree. Changed
defaults belong to one broker and last until restart, when the config file (which the user edits)
is the authority again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import msgspec

from txbroker.protocol.admin import TransactionSettings
from txbroker.store.records import GroupSettingsRecord
from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


def __now_ms() -> int:
    return int(time.time() * 1000)


class SettingsBook:
    def __init__(self, defaults: TransactionSettings, state: StateMachine):
        self._state = state
        self.defaults = defaults
        self.groups: dict[str, TransactionSettings] = {}
        self.generations: dict[str, int] = {}  # per group: what the operator last applied
        self._listeners: list[Callable[[], None]] = []
        state.on_group_settings.append(self._stored)
        self._stored(None)

    def _stored(self, group: str | None) -> None:
        """The store's group settings changed (a record applied here or replicated, a truncation)."""
        stored = self._state.group_settings
        for g in ([group] if group is not None else set(self.groups) | set(stored)):
            doc = stored.get(g)
            if doc is None:
                self.groups.pop(g, None)
                self.generations.pop(g, None)
                continue
            doc = dict(doc)
            self.generations[g] = doc.pop("generation", 0)
            try:
                self.groups[g] = msgspec.convert(doc, TransactionSettings)
            except msgspec.ValidationError as e:  # written by a broker that knew other settings
                log.error("stored settings of group %s are not ones this broker reads (%s): it keeps %s", g, e,
                          "the previous ones" if g in self.groups else "the defaults")
        self._changed()

    def on_change(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    def for_group(self, group: str) -> TransactionSettings:
        return self.groups.get(group, self.defaults)

    def tick_seconds(self) -> float:
        """How often the check-back service wakes: the shortest interval in force."""
        shortest = min([self.defaults.check_interval_ms] + [s.check_interval_ms for s in self.groups.values()])
        return shortest / 1000

    def update_defaults(self, changes: dict) -> TransactionSettings:
        merged = self.defaults.merged(changes, "transaction")
        self.defaults = merged
        self._changed()
        return merged

    def update_group(self, group: str, changes: dict, generation: int = 0
                     ) -> tuple[TransactionSettings, asyncio.Future]:
        """Merge `changes` into the group's settings (or the defaults) and log the result (the caller
        has checked this broker is master). Returns them and when they are durable and replicated."""
        merged = self.groups.get(group, self.defaults).merged(changes, f"groups.{group}")
        record = GroupSettingsRecord(group, _now_ms(), msgspec.to_builtins(merged), generation)
        return merged, self._state.append(record)[1]

    def remove_group(self, group: str) -> asyncio.Future | None:
        """Log the removal of the group's own settings; None if it has none."""
        if group not in self.groups:
            return None
        return self._state.append(GroupSettingsRecord(group, _now_ms()))[1]

    def _changed(self) -> None:
        for fn in self._listeners:
            fn()
