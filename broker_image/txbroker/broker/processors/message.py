"""VIEW_MESSAGE_BY_ID: a stored message by id, visible or not."""

from txbroker.broker.auth.acl import SUB
from txbroker.broker.replies import Reply, error, ok
from txbroker.protocol.bodies import ViewMessageRequest, decoder
from txbroker.protocol.codes import ResponseCode


class ViewMessageProcessor:
    def __init__(self, broker):
        self._decode = decoder(ViewMessageRequest).decode
        self._reader = broker.reader
        self._role = broker.role

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        self._role.require_current()
        try:
            got = self._reader.by_id(req.msg_id)
        except ValueError as e:
            return error(ResponseCode.MESSAGE_ILLEGAL, str(e))
        if got is None:
            return error(ResponseCode.QUERY_NOT_FOUND, f"no message with id {req.msg_id}")
        conn.access.require_topic(got[0].topic, SUB)  # known only once read
        return ok(got[0])
