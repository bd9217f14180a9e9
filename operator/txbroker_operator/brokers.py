"""The brokers' admin API (port 10912 of each pod), as the operator uses it.

Short timeouts: a broker that does not answer within them is treated as unreachable for this pass,
and the next pass asks again. Errors the broker answers with come back as BrokerError carrying its
code and message, so an Event can quote them.
"""

from __future__ import annotations

import json
from urllib.parse import quote
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import urllib3

from txbroker.protocol import admin as answers

from . import constants as c

T = TypeVar("T")

TIMEOUT = urllib3.Timeout(connect=1.0, read=3.0)
_plain_pool = urllib3.PoolManager(num_pools=16, maxsize=4, retries=False)


class BrokerError(Exception):
    def __init__(self, ip: str, status: int, body: Any):
        self.status = status
        self.code = body.get("code") if isinstance(body, dict) else None
        msg = body.get("error") or body.get("message") if isinstance(body, dict) else body
        super().__init__(f"broker {ip}: HTTP {status}: {msg}")


class Unreachable(Exception):
    pass


class NoHandover(Exception):
    """The broker cannot hand over gracefully (it predates POST /api/v1/handover)."""


class Incompatible(Exception):
    """The broker answered, in a form this operator cannot read (a broker and an operator of
    different versions, say during a rolling upgrade): it is alive, whatever it said."""


@dataclass(frozen=True)
class Access:
    """How to reach one TxBroker's admin API: plain HTTP by default; HTTPS verified against the
    TxBroker's CA (the certificate names `server_hostname`, since pods are reached by IP) and
    HTTP Basic credentials when its spec asks for them (security.py builds these)."""
    scheme: str = "http"
    authorization: str = ""
    pool: urllib3.PoolManager = _plain_pool

    def _call(self, ip: str, method: str, path: str, body: Any = None, query: dict | None = None,
              answer: type[T] | None = None, timeout: urllib3.Timeout = TIMEOUT) -> Any:
        """The broker's answer: decoded as `answer` (a protocol/admin.py type; Incompatible if it does
        not decode), or as plain JSON."""
        headers = {"Content-Type": "application/json"}
        if self.authorization:
            headers["Authorization"] = self.authorization
        try:
            r = self.pool.request(method, f"{self.scheme}://{ip}:{c.ADMIN_PORT}{path}",
                                  body=json.dumps(body).encode() if body is not None else None,
                                  fields=query, headers=headers, timeout=timeout)
        except urllib3.exceptions.HTTPError as e:
            raise Unreachable(f"broker {ip}: {e}") from e
        if 200 <= r.status < 300 and answer is not None:
            try:
                return msgspec.json.decode(r.data, type=answer)
            except (msgspec.ValidationError, msgspec.DecodeError) as e:
                raise Incompatible(f"broker {ip}: {method} {path} answered in a form this operator cannot read "
                                   f"({e}); are the broker and the operator of different versions?") from None
        try:
            decoded = json.loads(r.data) if r.data else None
        except ValueError:
            decoded = r.data.decode(errors="replace")
        if not 200 <= r.status < 300:
            raise BrokerError(ip, r.status, decoded)
        return decoded

    def info(self, ip: str) -> "BrokerInfo":
        return BrokerInfo.from_api(self._call(ip, "GET", "/api/v1/broker", answer=answers.BrokerInfo))

    def try_info(self, ip: str | None) -> "BrokerInfo | None":
        if not ip:
            return None
        try:
            return self.info(ip)
        except (Unreachable, BrokerError, Incompatible):
            return None

    def promote(self, ip: str, epoch: int, sync_set: list[str] | None = None) -> "BrokerInfo":
        """Master at `epoch`; `sync_set`: the slaves whose acknowledgements count from the start
        (recorded in the status first: sync_set.py)."""
        self._call(ip, "POST", "/api/v1/role", _with_sync_set({"role": c.ROLE_MASTER, "epoch": epoch}, sync_set))
        return self.info(ip)

    def confirm(self, ip: str, epoch: int, sync_set: list[str] | None = None) -> None:
        """A master that started again and awaits its controller's word: it still leads, at `epoch` (its own)."""
        self._call(ip, "POST", "/api/v1/role", _with_sync_set({"role": c.ROLE_MASTER, "epoch": epoch}, sync_set))

    def put_sync_set(self, ip: str, epoch: int, slaves: list[str]) -> "BrokerInfo":
        """The slaves whose acknowledgements the master at `epoch` counts (sync_set.py)."""
        return BrokerInfo.from_api(self._call(ip, "PUT", "/api/v1/replication/sync-set",
                                              {"epoch": epoch, "slaves": slaves}, answer=answers.BrokerInfo))

    def demote(self, ip: str, master_address: str, epoch: int) -> None:
        self._call(ip, "POST", "/api/v1/role", {"role": c.ROLE_SLAVE, "master": master_address, "epoch": epoch})

    def handover(self, ip: str, successor: str, epoch: int, timeout_ms: int) -> answers.Handover:
        """POST /api/v1/handover on a master: it takes no write until `successor` (one of its slaves,
        by name) holds its log to the end, then follows it. NoHandover: a broker from before 0.2.0,
        which cannot (the caller fences it first instead); BrokerError: refused or abandoned."""
        try:
            return self._call(ip, "POST", "/api/v1/handover",
                              {"successor": successor, "epoch": epoch, "timeout_ms": timeout_ms},
                              answer=answers.Handover, timeout=urllib3.Timeout(connect=1.0, read=timeout_ms / 1000 + 3))
        except BrokerError as e:
            if e.status == 404:
                raise NoHandover(f"broker {ip} has no POST /api/v1/handover (a broker before 0.2.0)") from None
            raise

    def put_transaction_defaults(self, ip: str, settings: dict) -> answers.TransactionSettings:
        return self._call(ip, "PUT", "/api/v1/config/transaction", settings, answer=answers.TransactionSettings)

    def groups(self, ip: str) -> dict[str, answers.GroupSettings]:
        """Per producer group: its settings and the generation the operator applied."""
        return self._call(ip, "GET", "/api/v1/groups", answer=dict[str, answers.GroupSettings])

    def put_group(self, ip: str, group: str, settings: dict, generation: int) -> answers.GroupSettings:
        return self._call(ip, "PUT", f"/api/v1/groups/{quote(group, safe='')}/transaction",
                          {**settings, "generation": generation}, answer=answers.GroupSettings)

    def delete_group(self, ip: str, group: str) -> None:
        try:
            self._call(ip, "DELETE", f"/api/v1/groups/{quote(group, safe='')}/transaction")
        except BrokerError as e:
            if e.status != 404:
                raise

    def cluster(self, ip: str) -> answers.ClusterInfo:
        """GET /api/v1/cluster: the broker's group and the route it runs."""
        return self._call(ip, "GET", "/api/v1/cluster", answer=answers.ClusterInfo)

    def route_version(self, ip: str) -> int:
        """The version of the cluster route the broker runs (0: none)."""
        route = self.cluster(ip).route or {}
        version = route.get("version", 0)
        if not isinstance(version, int):
            raise Incompatible(f"broker {ip}: GET /api/v1/cluster: route version {version!r} is not an integer")
        return version

    def drain(self, ip: str) -> answers.DrainStatus:
        """GET /api/v1/drain (a group's master): what it still holds for consumers and producers."""
        return self._call(ip, "GET", "/api/v1/drain", answer=answers.DrainStatus)

    def transaction_count(self, ip: str, group: str, state: str) -> int:
        return self._call(ip, "GET", "/api/v1/transactions", query={"group": group, "state": state, "limit": "0"},
                          answer=answers.TransactionList).total


PLAIN = Access()


def _with_sync_set(body: dict, sync_set: list[str] | None) -> dict:
    return body if sync_set is None else {**body, "sync_set": sync_set}


@dataclass(frozen=True)
class BrokerInfo:
    """What GET /api/v1/broker says about one broker."""
    role: str
    epoch: int
    log_end_offset: int
    master: str
    fenced_by: int
    pending: int
    parked: int
    slaves: tuple[dict, ...]     # as a master: per follower address, acknowledged offset, lag, in_sync
    connected: bool              # as a slave: replicating from its master right now
    sync_replicas: int = 0       # as a SYNC master: slaves that must hold a write before it is acknowledged
    version: str = ""            # the broker's software version
    store_format: int = 0        # the store format it writes (0: a broker before 0.2.0, which did not say)
    incompatible: str = ""       # replication refused for the two brokers' versions (either side says so): why
    handover: str = ""           # a master handing over to a successor (switchover under way)
    unconfirmed: str = ""        # a restarted master taking no write until its controller confirms it: why
    sync_set: tuple[str, ...] | None = None   # as a master under a controller: the slaves its SYNC writes count
    recorded_slaves: tuple[str, ...] = ()      # as a master: the slaves that subscribed at its epoch

    @classmethod
    def from_api(cls, a: answers.BrokerInfo) -> "BrokerInfo":
        """The operator's view of a broker's answer (decoded and checked by then)."""
        rep = a.replication
        return cls(role=a.role, epoch=a.epoch, log_end_offset=a.log_end_offset, master=a.master,
                   fenced_by=a.fenced_by, pending=a.pending_transactions, parked=a.parked_transactions,
                   slaves=tuple(msgspec.structs.asdict(s) for s in rep.slaves), connected=rep.connected,
                   sync_replicas=rep.sync_replicas if rep.mode == "SYNC" else 0, version=a.version,
                   store_format=a.store_format, incompatible=rep.incompatible, handover=a.handover,
                   unconfirmed=a.unconfirmed, recorded_slaves=tuple(rep.recorded_slaves),
                   sync_set=None if rep.sync_set is None else tuple(rep.sync_set))

    @property
    def is_master(self) -> bool:
        return self.role == c.ROLE_MASTER

    @property
    def hands_over(self) -> bool:
        """It has POST /api/v1/handover (0.2.0 on, which also reports its store format)."""
        return self.store_format > 0
