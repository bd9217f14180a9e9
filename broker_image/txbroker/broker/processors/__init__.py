"""One processor per request code, as RocketMQ's broker has. `handlers(broker)` is the table the
connection dispatches on; a handler takes (connection, body bytes) and returns a Reply, or a
coroutine that produces one."""

from __future__ import annotations

from txbroker.protocol.codes import RequestCode

from . import client, end_transaction, message, pull, replication, send, topic


def handlers(broker) -> dict[int, object]:
    return {
        RequestCode.SEND_MESSAGE: send.SendProcessor(broker),
        RequestCode.END_TRANSACTION: end_transaction.EndTransactionProcessor(broker),
        RequestCode.PULL_MESSAGE: pull.PullProcessor(broker),
        RequestCode.HEARTBEAT: client.HeartbeatProcessor(broker),
        RequestCode.UNREGISTER_CLIENT: client.UnregisterProcessor(broker),
        RequestCode.GET_ROUTEINFO_BY_TOPIC: topic.RouteProcessor(broker),
        RequestCode.UPDATE_AND_CREATE_TOPIC: topic.CreateTopicProcessor(broker),
        RequestCode.VIEW_MESSAGE_BY_ID: message.ViewMessageProcessor(broker),
        RequestCode.REPLICATION_SUBSCRIBE: replication.SubscribeProcessor(broker),
        RequestCode.REPLICATION_ACK: replication.AckProcessor(broker),
    }
