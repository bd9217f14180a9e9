"""HEARTBEAT and UNREGISTER_CLIENT: which connection speaks for which producer group."""

from txbroker.broker.config import ConfigError, parse_address
from txbroker.broker.replies import Reply, RequestError, ok
from txbroker.protocol.bodies import HeartbeatRequest, HeartbeatResponse, decoder
from txbroker.protocol.codes import ResponseCode


class HeartbeatProcessor:
    def __init__(self, broker):
        self._decode = decoder(HeartbeatRequest).decode
        self._broker = broker

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        if req.master_address:
            # Checked here, not when the hint is followed: a malformed address would only fail in a
            # background task, after this heartbeat was answered as if it were fine.
            try:
                parse_address(req.master_address, "heartbeat master_address")
            except ConfigError as e:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, str(e)) from None
        # Registering as a producer of a group is what brings that group's check-backs here.
        for g in req.producer_groups:
            conn.access.require_producer_group(g)
        for g in req.consumer_groups:
            conn.access.require_consumer_group(g)
        conn.client_id = req.client_id
        self._broker.producers.heartbeat(conn, req.producer_groups)
        if req.consumer_groups:
            self._broker.consumers.heartbeat(conn, req.client_id, req.consumer_groups)
        role = self._broker.role
        if role.is_master and req.master_epoch > role.epoch and req.master_address:
            self._broker.roles.check_newer_master(req.master_address, req.master_epoch, f"client {req.client_id or conn.peer}")
        return ok(HeartbeatResponse(self._broker.config.broker_name, role.role, role.epoch, role.master_address))


class UnregisterProcessor:
    def __init__(self, broker):
        self._broker = broker

    def __call__(self, conn, body: bytes) -> Reply:
        self._broker.producers.remove(conn)
        self._broker.consumers.remove_connection(conn)
        return ok()
