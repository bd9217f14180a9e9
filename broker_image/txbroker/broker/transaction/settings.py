"""Transaction settings: broker defaults plus per-producer-group overrides, both changeable live.

Group overrides are what the operator pushes from a TxProducerGroup; they are kept in the store's
meta family so a restarted broker keeps them. Changed defaults last until restart, when the config
file (which the user edits) is the authority again.
"""

from __future__ import annotations

import json
from typing import Callable

import msgspec

from txbroker.broker.config import TransactionSettings

_GROUP_PREFIX = b"config/group/"


class SettingsBook:
    def __init__(self, defaults: TransactionSettings, meta=None):
        self._meta = meta  # the store's meta column family, or None for in-memory only
        self.defaults = defaults
        self.groups: dict[str, TransactionSettings] = {}
        self.generations: dict[str, int] = {}  # per group: what the operator last applied
        self._listeners: list[Callable[[], None]] = []
        if meta is not None:
            self._load()

    def _load(self) -> None:
        for k, v in self._meta.items(from_key=_GROUP_PREFIX):
            if not k.startswith(_GROUP_PREFIX):
                break
            doc = json.loads(v)
            group = k[len(_GROUP_PREFIX):].decode()
            self.generations[group] = doc.pop("generation", 0)
            self.groups[group] = msgspec.convert(doc, TransactionSettings)

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

    def update_group(self, group: str, changes: dict, generation: int = 0) -> TransactionSettings:
        merged = self.groups.get(group, self.defaults).merged(changes, f"groups.{group}")
        self.groups[group] = merged
        self.generations[group] = generation
        self._persist(_GROUP_PREFIX + group.encode(), {**msgspec.to_builtins(merged), "generation": generation})
        self._changed()
        return merged

    def remove_group(self, group: str) -> bool:
        found = self.groups.pop(group, None) is not None
        self.generations.pop(group, None)
        if self._meta is not None:
            self._meta.delete(_GROUP_PREFIX + group.encode())
        self._changed()
        return found

    def _persist(self, key: bytes, doc: dict) -> None:
        if self._meta is not None:
            self._meta.put(key, json.dumps(doc).encode())

    def _changed(self) -> None:
        for fn in self._listeners:
            fn()

