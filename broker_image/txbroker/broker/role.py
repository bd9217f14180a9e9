"""The broker's role (master or slave) and epoch. Only a master changes state (invariant I5).

The epoch lives in the log (EpochRecord), so master and slaves agree on it; this object only
says what this broker is now. A master that learns of a higher epoch is `fenced`: it answers
CONTROLLER_FENCED_MASTER_EPOCH until it is told where the new master is.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from txbroker.broker.replies import RequestError
from txbroker.protocol.codes import ResponseCode

MASTER = "master"
SLAVE = "slave"


class RoleState:
    def __init__(self, role: str, epoch: Callable[[], int], master_address: str = ""):
        self.role = role
        self._epoch = epoch
        # Set by replication's leader while it leads (broker/replication/leader.py attach/detach): only
        # then is a write held for the slaves. A master is not yet leading while it starts or is
        # promoted (its epoch record being written) and no longer while it stops; a write answered
        # then would be published at once, with no slave holding it.
        self.leading = False
        self.master_address = master_address
        self.fenced_by = 0  # the higher epoch that deposed this broker, if any
        self.probation = ""  # a master that takes no write yet: why (broker/failover.py)
        self.unconfirmed = ""  # a restarted master awaiting its controller's word (broker/failover.py): why
        self.stepped_down = ""  # a master that gave up its role (lost records its slaves have): why
        # A master handing over to a successor (a switchover, broker/failover.py hand_over): to whom.
        # It takes no write meanwhile; client requests wait at `gate` (dispatch.py) until it is done.
        self.handover = ""
        self.gate: asyncio.Future | None = None

    @property
    def epoch(self) -> int:
        return self._epoch()

    @property
    def is_master(self) -> bool:
        return self.role == MASTER

    @property
    def on_hold(self) -> str:
        """Why a master takes no write yet (probation, or its controller's word awaited), or ""."""
        return self.unconfirmed or self.probation

    def require_current(self) -> None:
        """Reads a slave answers too, lagging as a slave does: refused by a master on hold, whose log
        may lack a tail its slaves hold (seed 450's), while clients take its answers for the master's."""
        if self.role == MASTER and self.on_hold:
            raise RequestError(ResponseCode.SLAVE_NOT_AVAILABLE, self.on_hold)

    def require_master(self, for_slave: bool = False) -> None:
        """Refuse unless this broker is a master taking writes. `for_slave`: a slave's request, which a
        master on probation still serves (a slave that must seed itself may be what it waits for)."""
        if self.role == MASTER:
            if not self.leading:
                raise RequestError(ResponseCode.SLAVE_NOT_AVAILABLE,
                                   "this master is starting, being promoted or stopping: it takes writes only "
                                   "while it leads its slaves")
            hold = self.unconfirmed if for_slave else self.on_hold
            if hold:
                raise RequestError(ResponseCode.SLAVE_NOT_AVAILABLE, hold)
            if self.handover:
                raise RequestError(ResponseCode.SLAVE_NOT_AVAILABLE,
                                   f"this master is handing over {self.handover} and takes no write")
            return
        if self.stepped_down:
            raise RequestError(ResponseCode.SLAVE_NOT_AVAILABLE, self.stepped_down)
        if self.fenced_by:
            raise RequestError(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                               f"this broker was master at epoch {self.epoch} and has been deposed by epoch "
                               f"{self.fenced_by}; it changes nothing")
        where = f"; the master is {self.master_address}" if self.master_address else ""
        raise RequestError(ResponseCode.SLAVE_NOT_AVAILABLE, f"this broker is a slave and changes nothing{where}")
