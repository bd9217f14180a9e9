"""Making a dead letter without waiting out a consumer's retries."""

from __future__ import annotations

import asyncio

from txbroker.client.connection import BrokerClient
from txbroker.protocol.bodies import SendBackRequest
from txbroker.protocol.codes import RequestCode


def dead_letter(b, group: str, msg_id: str, topic: str) -> None:
    """The group's send-back of a message past its retries (one allowed, one made): a dead letter."""
    async def go():
        c = BrokerClient(b.address)
        try:
            await c.request(RequestCode.CONSUMER_SEND_MSG_BACK, SendBackRequest(group, msg_id, topic, 1, 1))
        finally:
            await c.close()

    asyncio.run(go())
