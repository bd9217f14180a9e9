"""What a broker answers to requests it must refuse."""

from __future__ import annotations

import asyncio

from txbroker.client import BrokerError


def end_transaction_refusal(address: str, group: str) -> BrokerError:
    """Send END_TRANSACTION (COMMIT of a made-up transaction) to one broker, as a client that does not
    insist on a master would; return the error it answers with (AssertionError if it accepts)."""
    from txbroker.client.connection import BrokerClient
    from txbroker.protocol.bodies import EndTransactionRequest
    from txbroker.protocol.codes import RequestCode, TransactionState

    async def send():
        c = BrokerClient(address, require_master=False)
        try:
            await c.request(RequestCode.END_TRANSACTION, EndTransactionRequest(group, "t", TransactionState.COMMIT))
        finally:
            await c.close()
    try:
        asyncio.run(send())
    except BrokerError as e:
        return e
    raise AssertionError(f"{address} accepted END_TRANSACTION")
