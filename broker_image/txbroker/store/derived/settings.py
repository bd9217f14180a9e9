"""Producer groups' transaction settings (GroupSettingsRecord; meta `config/group/<name>`, a JSON doc
of the settings and the generation the operator applied). broker/transaction/settings.py reads them
and hears of every change (`on_change`: a group, or None when any may have changed).

Retention keeps each group's newest settings record (lineage); truncation takes each group a
dropped record set from the newest kept record (none: the group's settings are removed)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable

from txbroker.store import keys
from txbroker.store.derived.family import Family
from txbroker.store.derived.latest import walk_back
from txbroker.store.records import GroupSettingsRecord

if TYPE_CHECKING:
    from rocksdict import WriteBatch

    from txbroker.store.db import Database
    from txbroker.store.group_commit import Batch

_LSN = "_lsn"  # in the stored doc only: the record that set it


class Settings(Family):
    def __init__(self, db: "Database"):
        self._db = db
        self._h_meta = db.handles["meta"]
        self.groups: dict[str, dict] = {}  # group -> {**settings, "generation": n}
        self._set_at: dict[str, int] = {}
        self.on_change: list[Callable[[str | None], None]] = []

    def appliers(self):
        return {GroupSettingsRecord: self.apply}

    def load(self) -> None:
        self.groups.clear()
        self._set_at.clear()
        for k, v in self._db.meta.items(from_key=keys.GROUP_SETTINGS_PREFIX):
            if not k.startswith(keys.GROUP_SETTINGS_PREFIX):
                break
            doc = json.loads(v)
            group = k[len(keys.GROUP_SETTINGS_PREFIX):].decode()
            lsn = doc.pop(_LSN, 0)
            self.groups[group] = doc
            if lsn:
                self._set_at[group] = lsn
        self._tell(None)

    def apply(self, r: GroupSettingsRecord, lsn: int, b: "Batch") -> None:
        self._set(r, lsn, b.wb)
        self._tell(r.group)

    def _set(self, r: GroupSettingsRecord, lsn: int, wb: "WriteBatch") -> None:
        key = keys.group_settings_key(r.group)
        if r.settings:
            doc = {**r.settings, "generation": r.generation}
            self.groups[r.group] = doc
            self._set_at[r.group] = lsn
            wb.put(key, json.dumps({**doc, _LSN: lsn}).encode(), self._h_meta)
        else:
            self.groups.pop(r.group, None)
            self._set_at.pop(r.group, None)
            wb.delete(key, self._h_meta)

    def _tell(self, group: str | None) -> None:
        for fn in self.on_change:
            fn(group)

    def lineage(self):
        return self._set_at.values()

    def cut(self, dropped, last_kept: int, scratch: "Batch") -> None:
        groups = {r.group for _lsn, r in dropped if type(r) is GroupSettingsRecord}
        if not groups:
            return
        for lsn, r in walk_back(self._db, last_kept, lambda r: type(r) is GroupSettingsRecord and r.group in groups):
            groups.discard(r.group)
            self._set(r, lsn, scratch.wb)
            if not groups:
                break
        for group in groups:  # set only by dropped records: removed
            self._set(GroupSettingsRecord(group, 0), 0, scratch.wb)
