"""REPLICATION_SUBSCRIBE, REPLICATION_ACK and REPLICATION_SNAPSHOT: a slave's requests to its master."""

from txbroker.broker.replies import Reply
from txbroker.protocol.bodies import ReplicaAck, ReplicaSubscribe, SnapshotRequest, decoder


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


class SnapshotProcessor:
    """A copy of the master's store for a slave to seed itself from (broker/replication/seed.py)."""

    def __init__(self, broker):
        self._decode = decoder(SnapshotRequest).decode
        self._broker = broker

    def __call__(self, conn, body: bytes) -> Reply:
        conn.access.require_replication()
        req = self._decode(body)
        # a seed comes from the master, never from a node that may lag; on probation too, or a group
        # whose master restarted and whose slave must seed would wait on each other for good
        self._broker.role.require_master(for_slave=True)
        conn.replica = True
        return self._broker.snapshots.handle(req)
