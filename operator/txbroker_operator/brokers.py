"""The brokers' admin API (HTTP on port 10912 of each pod), as the operator uses it.

Short timeouts: a broker that does not answer within them is treated as unreachable for this pass,
and the next pass asks again. Errors the broker answers with come back as BrokerError carrying its
code and message, so an Event can quote them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import urllib3

from . import constants as c

_pool = urllib3.PoolManager(num_pools=16, maxsize=4, retries=False)
TIMEOUT = urllib3.Timeout(connect=1.0, read=3.0)


class BrokerError(Exception):
    def __init__(self, ip: str, status: int, body: Any):
        self.status = status
        self.code = body.get("code") if isinstance(body, dict) else None
        msg = body.get("error") or body.get("message") if isinstance(body, dict) else body
        super().__init__(f"broker {ip}: HTTP {status}: {msg}")


class Unreachable(Exception):
    pass


def _call(ip: str, method: str, path: str, body: Any = None, query: dict | None = None) -> Any:
    url = f"http://{ip}:{c.ADMIN_PORT}{path}"
    try:
        r = _pool.request(method, url, body=json.dumps(body).encode() if body is not None else None,
                          fields=query, headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
    except urllib3.exceptions.HTTPError as e:
        raise Unreachable(f"broker {ip}: {e}") from e
    try:
        decoded = json.loads(r.data) if r.data else None
    except ValueError:
        decoded = r.data.decode(errors="replace")
    if not 200 <= r.status < 300:
        raise BrokerError(ip, r.status, decoded)
    return decoded


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

    @property
    def is_master(self) -> bool:
        return self.role == c.ROLE_MASTER


def info(ip: str) -> BrokerInfo:
    d = _call(ip, "GET", "/api/v1/broker")
    rep = d.get("replication") or {}
    return BrokerInfo(role=d["role"], epoch=int(d["epoch"]), log_end_offset=int(d["log_end_offset"]),
                      master=d.get("master") or "", fenced_by=int(d.get("fenced_by") or 0),
                      pending=int(d.get("pending_transactions", 0)), parked=int(d.get("parked_transactions", 0)),
                      slaves=tuple(rep.get("slaves") or ()), connected=bool(rep.get("connected")))


def try_info(ip: str | None) -> BrokerInfo | None:
    if not ip:
        return None
    try:
        return info(ip)
    except (Unreachable, BrokerError, KeyError, ValueError, TypeError):
        return None


def promote(ip: str, epoch: int) -> BrokerInfo:
    _call(ip, "POST", "/api/v1/role", {"role": c.ROLE_MASTER, "epoch": epoch})
    return info(ip)


def demote(ip: str, master_address: str, epoch: int) -> None:
    _call(ip, "POST", "/api/v1/role", {"role": c.ROLE_SLAVE, "master": master_address, "epoch": epoch})


def put_transaction_defaults(ip: str, settings: dict) -> dict:
    return _call(ip, "PUT", "/api/v1/config/transaction", settings)


def transaction_defaults(ip: str) -> dict:
    return _call(ip, "GET", "/api/v1/config")["transaction"]


def groups(ip: str) -> dict[str, dict]:
    """Per producer group: its settings and the generation the operator applied."""
    return _call(ip, "GET", "/api/v1/groups")


def put_group(ip: str, group: str, settings: dict, generation: int) -> dict:
    return _call(ip, "PUT", f"/api/v1/groups/{group}/transaction", {**settings, "generation": generation})


def delete_group(ip: str, group: str) -> None:
    try:
        _call(ip, "DELETE", f"/api/v1/groups/{group}/transaction")
    except BrokerError as e:
        if e.status != 404:
            raise


def transaction_count(ip: str, group: str, state: str) -> int:
    return int(_call(ip, "GET", "/api/v1/transactions", query={"group": group, "state": state, "limit": "0"})["total"])
