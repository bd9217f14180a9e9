"""Which slaves may hold records of this master's epoch that it acknowledged: kept in the store, so
a master that restarts with its log cut short (a power cut under ASYNC flush, a damaged log) knows
whom to wait for before it takes a write (broker/failover.py, probation).

Any subscribed slave may acknowledge a SYNC write, so a slave is recorded (durably) before its
feed starts. One that leaves is forgotten only once another recorded slave, still subscribed, has
acknowledged everything that was sent to it: from then on what it holds, that one holds too, and a
probation that hears from that one need not wait for it. Kept per epoch and broker: a promoted
slave leads a new epoch and starts with no record, and a copy of the store (a slave's seed, a
backup restored) is not its master. The probation's list is what the last run recorded;
`forget` is for a slave gone for good (the operator's or a person's word), never implied.
"""

from __future__ import annotations

import json
import logging

log = logging.getLogger(__name__)


class SlaveRecord:
    def __init__(self, state, broker_name: str):
        self._state = state
        self._broker_name = broker_name
        self.epoch, self.names = self._load()
        self.leaving: dict[str, int] = {}  # a slave that left -> the last LSN sent to it
        self.on_forget = lambda name, by: None  # told of each slave forgotten, and which one holds all it had

    def _load(self) -> tuple[int, set[str]]:
        raw = self._state.slave_record()
        if raw is None:
            return 0, set()
        doc = json.loads(raw)
        if doc.get("broker") != self._broker_name:
            return 0, set()
        return int(doc["epoch"]), set(doc["names"])

    def of_epoch(self, epoch: int) -> set[str]:
        """The slaves recorded while this broker led `epoch` (none for another epoch)."""
        return set(self.names) if epoch == self.epoch else set()

    def _save(self, sync: bool) -> None:
        doc = json.dumps({"epoch": self.epoch, "broker": self._broker_name, "names": sorted(self.names)}).encode()
        self._state.keep_slave_record(doc, sync)

    def subscribed(self, name: str) -> None:
        """Before `name`'s feed starts: durably, so that a crash never forgets a slave that may have
        acknowledged something."""
        self.leaving.pop(name, None)
        epoch = self._state.epoch
        if epoch != self.epoch:
            self.epoch, self.names = epoch, set()
        if name not in self.names:
            self.names.add(name)
            self._save(sync=True)

    def left(self, name: str, sent_through: int, others: dict[str, int]) -> None:
        """`name` disconnected, `sent_through` the last LSN sent to it; `others`: each slave still
        subscribed -> what it acknowledged."""
        if name in self.names:
            self.leaving[name] = max(sent_through, self.leaving.get(name, 0))
            for other, acked in others.items():
                self.acknowledged(other, acked)

    def acknowledged(self, name: str, lsn: int) -> None:
        """`name` (subscribed) holds everything through `lsn`: a slave that left holding no more is
        forgotten (the leader asks only while someone is leaving)."""
        if name not in self.names:
            return
        gone = [n for n, through in self.leaving.items() if n != name and through <= lsn]
        for n in gone:
            del self.leaving[n]
            self.names.discard(n)
            self.on_forget(n, name)
            log.info("slave %s forgotten: slave %s holds everything sent to it", n, name)
        if gone:
            try:
                self._save(sync=False)
            except Exception as e:  # noqa: BLE001 - the stored record keeps those names: longer than needed is safe
                log.warning("could not save the slave record without %s (it keeps listing them, which is safe): %s",
                            ", ".join(gone), e)

    def forget(self, name: str) -> bool:
        """A slave gone for good: a probation no longer waits for it, whatever it held."""
        if name not in self.names:
            return False
        self.names.discard(name)
        self.leaving.pop(name, None)
        self._save(sync=True)
        self.on_forget(name, None)
        return True
