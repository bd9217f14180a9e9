"""One processor per request code, as RocketMQ's broker has. `handlers(broker)` is the table the
connection dispatches on; a handler takes (connection, body bytes) and returns a Reply, or a
coroutine that produces one.

Rights are checked in each processor through `conn.access` (a no-op object when authentication is
off), right after decoding, before anything is read or changed."""

from __future__ import annotations

from txbroker.protocol.codes import RequestCode

from . import auth, client, cluster, consumer, end_transaction, job, message, pull, replication, send, topic


def handlers(broker) -> dict[int, object]:
    sending = send.SendProcessor(broker)
    return {
        RequestCode.SEND_MESSAGE: sending,
        RequestCode.SEND_MESSAGE_SHARED: sending,
        RequestCode.END_TRANSACTION: end_transaction.EndTransactionProcessor(broker),
        RequestCode.PULL_MESSAGE: pull.PullProcessor(broker),
        RequestCode.HEARTBEAT: client.HeartbeatProcessor(broker),
        RequestCode.UNREGISTER_CLIENT: client.UnregisterProcessor(broker),
        RequestCode.GET_ROUTEINFO_BY_TOPIC: topic.RouteProcessor(broker),
        RequestCode.UPDATE_AND_CREATE_TOPIC: topic.CreateTopicProcessor(broker),
        RequestCode.VIEW_MESSAGE_BY_ID: message.ViewMessageProcessor(broker),
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer.ConsumerListProcessor(broker),
        RequestCode.UPDATE_CONSUMER_OFFSET: consumer.CommitOffsetsProcessor(broker),
        RequestCode.QUERY_CONSUMER_OFFSET: consumer.QueryOffsetsProcessor(broker),
        RequestCode.CONSUMER_SEND_MSG_BACK: consumer.SendBackProcessor(broker),
        RequestCode.LOCK_BATCH_MQ: consumer.LockQueuesProcessor(broker),
        RequestCode.UNLOCK_BATCH_MQ: consumer.LockQueuesProcessor(broker, unlock=True),
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: consumer.SearchOffsetProcessor(broker),
        RequestCode.QUERY_MESSAGE: consumer.QueryByKeyProcessor(broker),
        RequestCode.REPLICATION_SUBSCRIBE: replication.SubscribeProcessor(broker),
        RequestCode.REPLICATION_ACK: replication.AckProcessor(broker),
        RequestCode.REPLICATION_SNAPSHOT: replication.SnapshotProcessor(broker),
        RequestCode.SASL_AUTHENTICATE: auth.SaslAuthenticateProcessor(broker),
        RequestCode.OPEN_JOB: job.JobProcessor(broker, "open"),
        RequestCode.PREPARE_JOB: job.JobProcessor(broker, "prepare"),
        RequestCode.DECIDE_JOB: job.JobProcessor(broker, "decide"),
        RequestCode.QUERY_JOB: job.JobProcessor(broker, "query"),
        RequestCode.QUERY_JOB_MEMBERS: job.JobMembersProcessor(broker),
        RequestCode.QUERY_JOBS_SETTLED: job.JobsSettledProcessor(broker),
        RequestCode.GET_BROKER_CLUSTER_INFO: cluster.ClusterRouteProcessor(broker),
        RequestCode.QUERY_TRANSACTION_STATES: cluster.TransactionStatesProcessor(broker),
    }
