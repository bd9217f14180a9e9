"""Broker groups: GET_BROKER_CLUSTER_INFO (the route a client bootstraps from) and
QUERY_TRANSACTION_STATES (a participant group asking the home group how a transaction ended)."""

from txbroker.broker.replies import Reply, RequestError, ok
from txbroker.broker.transaction.home import states_as_published
from txbroker.protocol.bodies import TransactionStatesRequest, TransactionStatesResponse, decoder
from txbroker.protocol.cluster import ClusterRouteResponse
from txbroker.protocol.codes import ResponseCode

MAX_IDS = 10_000


class ClusterRouteProcessor:
    def __init__(self, broker):
        self._cluster = broker.cluster

    def __call__(self, conn, body: bytes) -> Reply:
        return ok(ClusterRouteResponse(self._cluster.group, self._cluster.route))


class TransactionStatesProcessor:
    def __init__(self, broker):
        self._decode = decoder(TransactionStatesRequest).decode
        self._state = broker.state
        self._role = broker.role

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        try:  # another group's broker (its replication credentials), or the group's own producers
            conn.access.require_replication()
        except RequestError:
            conn.access.require_producer_group(req.producer_group)
        if len(req.transaction_ids) > MAX_IDS:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"{len(req.transaction_ids)} transaction ids; at most {MAX_IDS}")
        self._role.require_master()  # a slave's view lags its master's
        return ok(TransactionStatesResponse(states_as_published(self._state, req.producer_group, req.transaction_ids)))
