"""GET_ROUTEINFO_BY_TOPIC and UPDATE_AND_CREATE_TOPIC."""

from txbroker.broker.replies import Reply, ok
from txbroker.protocol.bodies import CreateTopicRequest, RouteRequest, RouteResponse, decoder


class RouteProcessor:
    def __init__(self, broker):
        self._decode = decoder(RouteRequest).decode
        self._broker = broker

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_route(req.topic)
        count = self._broker.topics.require(req.topic)
        role = self._broker.role
        return ok(RouteResponse(req.topic, count, self._broker.config.broker_name, role.role, role.epoch))


class CreateTopicProcessor:
    def __init__(self, broker):
        self._decode = decoder(CreateTopicRequest).decode
        self._broker = broker

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        conn.access.require_create_topic(req.topic)
        self._broker.role.require_master()
        self._broker.topics.create(req.topic, req.queue_count)
        return ok(None, self._broker.state.barrier())
