"""SEND_MESSAGE: plain messages are stored visible; with a transaction id, as one half message batch.
SEND_MESSAGE_SHARED is the same with properties every message carries sent once."""

from txbroker.broker.replies import Reply, RequestError, ok
from txbroker.broker.transaction.service import now_ms
from txbroker.protocol.bodies import SendRequest, SendResponse, decoder
from txbroker.protocol.codes import ResponseCode
from txbroker.protocol.properties import share_properties
from txbroker.store import keys


class SendProcessor:
    def __init__(self, broker):
        self._decode = decoder(SendRequest).decode
        self._tx = broker.transactions
        self._topics = broker.topics
        self._state = broker.state
        self._role = broker.role
        self._cluster = broker.cluster
        self._sent = broker.metrics.sent_normal
        self._group_sent = broker.metrics.group_sent_normal

    def __call__(self, conn, body: bytes) -> Reply:
        req = self._decode(body)
        access = conn.access
        access.require_publish(req.messages)
        if req.transaction_id:  # (a draining group still answers a retry of what it stored: prepare)
            access.require_producer_group(req.producer_group)
            return self._tx.prepare(req)
        if self._cluster.draining:  # a draining group takes no new messages
            self._cluster.refuse_draining()
        if req.job_id:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"job {req.job_id}: only a transactional send (with a "
                                                             "transaction id) can join a job")
        self._role.require_master()
        msgs = req.messages
        if req.properties:  # a plain send's record stores each message whole
            share_properties(msgs, req.properties)
        self._topics.validate_for_send(msgs)
        lsn, offsets, durable = self._state.append_messages(now_ms(), msgs)
        self._sent.inc(len(msgs))
        self._group_sent(req.producer_group).inc(len(msgs))
        return ok(SendResponse(keys.msg_ids(lsn, len(msgs)), [m.queue_id for m in msgs], offsets), durable)
