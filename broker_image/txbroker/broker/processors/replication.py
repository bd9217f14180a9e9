"""REPLICATION_SUBSCRIBE and REPLICATION_ACK: a slave's requests to its master."""

from txbroker.broker.replies import Reply
from txbroker.protocol.bodies import ReplicaAck, ReplicaSubscribe, decoder


class SubscribeProcessor:
    def __init__(self, broker):
        self._decode = decoder(ReplicaSubscribe).decode
        self._broker = broker

    def __call__(self, conn, body: bytes) -> Reply:
        conn.access.require_replication()
        req = self._decode(body)
        conn.replica = True  # a quiet log is no reason to close a slave's connection
        return self._broker.leader.subscribe(conn, req)


class AckProcessor:
    def __init__(self, broker):
        self._decode = decoder(ReplicaAck).decode
        self._broker = broker

    def __call__(self, conn, body: bytes) -> None:
        conn.access.require_replication()
        self._broker.leader.ack(conn, self._decode(body))  # one-way: no answer
