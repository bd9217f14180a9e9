"""END_TRANSACTION: a producer's (or a check-back answer's) commit, rollback or unknown."""

from txbroker.broker.replies import Reply
from txbroker.protocol.bodies import EndTransactionRequest, decoder


class EndTransactionProcessor:
    def __init__(self, broker):
        self._decode = decoder(EndTransactionRequest).decode
        self._tx = broker.transactions

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_producer_group(req.producer_group)
        return self._tx.end(req, "check" if req.from_transaction_check else "producer")
