"""The broker's role (master or slave) and epoch. Only a master changes state (invariant I5)."""

from __future__ import annotations

from dataclasses import dataclass

from txbroker.broker.replies import RequestError
from txbroker.protocol.codes import ResponseCode

MASTER = "master"
SLAVE = "slave"


@dataclass
class RoleState:
    role: str
    epoch: int = 0
    master_address: str = ""

    @property
    def is_master(self) -> bool:
        return self.role == MASTER

    def require_master(self) -> None:
        if self.role != MASTER:
            where = f"; the master is {self.master_address}" if self.master_address else ""
            raise RequestError(ResponseCode.SLAVE_NOT_AVAILABLE, f"this broker is a slave and changes nothing{where}")
