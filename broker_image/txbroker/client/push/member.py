"""What every part of one push consumer shares: who it is in the group, its connection, whether it
still runs, its counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txbroker.client.push.structs import ConsumerStats

if TYPE_CHECKING:
    from txbroker.client.connection import BrokerClient


@dataclass
class Member:
    group: str
    client_id: str
    client: BrokerClient
    stats: ConsumerStats = field(default_factory=ConsumerStats)
    # Loops end when `running` goes; send-backs go on until `closed`, so a batch failing while the
    # consumer shuts down still reaches the broker before the last offset commit.
    running: bool = False
    closed: bool = False
