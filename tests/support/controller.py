"""The operator's failover decisions driven by a test over real brokers: a controller's looks are the
test's own steps (tests/integration/test_sync_set.py, test_damaged_slave.py)."""

import asyncio

import msgspec

from txbroker.client import AsyncProducer, Message
from txbroker.client.admin import AdminClient
from txbroker.client.errors import ClientError
from txbroker.protocol import admin as answers
from txbroker_operator import constants as c, status as op_status, sync_set
from txbroker_operator.brokers import BrokerInfo
from txbroker_operator.observe import Member


def send(address: str, body: str) -> str:
    """What a producer sending one message to `address` now is told: 'acknowledged' or the error."""
    async def go():
        p = AsyncProducer("pg", address, request_timeout=2)
        try:
            await p.send(Message("T", body.encode()))
            return "acknowledged"
        except ClientError as e:
            return f"refused: {e}"
        finally:
            await p.close()
    return asyncio.run(go())


def info(b) -> dict:
    return AdminClient(b.admin_url).get("/api/v1/broker")


def subscribed(b) -> set[str]:
    """The slaves subscribed to master `b`, by name."""
    return {x["name"] for x in info(b)["replication"]["slaves"]}


def operator_view(b) -> BrokerInfo | None:
    """The broker as the operator reads it, or None when it does not answer (killed, paused)."""
    try:
        return BrokerInfo.from_api(msgspec.convert(AdminClient(b.admin_url, timeout=1).broker_info(),
                                                   answers.BrokerInfo))
    except Exception:  # noqa: BLE001
        return None


class Controller:
    """The controller's pass over one group, with the operator's own functions: the status (a dict
    here, the TxBroker's status there), its sampled broker entries, the sync set kept."""

    def __init__(self, brokers: dict):
        self.brokers = brokers
        self.status = {"master": "m", "epoch": 1, "brokers": []}

    def look(self) -> dict[str, Member]:
        members = {}
        for i, (name, b) in enumerate(self.brokers.items()):
            role = "master" if name == self.status["master"] else "slave"
            pod = {"metadata": {"name": name, "labels": {c.LABEL_ROLE: role, c.LABEL_INDEX: str(i)}},
                   "status": {"podIP": f"10.0.0.{i + 1}", "conditions": [{"type": "Ready", "status": "True"}]}}
            members[name] = Member(name, i, pod, operator_view(b))
        self.status["brokers"] = op_status.broker_entries(members, self.status["master"], self.status["brokers"])
        return members

    def keep_sync_set(self) -> None:
        head = self.brokers[self.status["master"]]

        def push(epoch: int, slaves: list[str]) -> BrokerInfo:
            AdminClient(head.admin_url).put("/api/v1/replication/sync-set", {"epoch": epoch, "slaves": slaves})
            return operator_view(head)
        sync_set.keep(self.status, self.look()[self.status["master"]], lambda s: self.status.update(syncSet=s), push)
