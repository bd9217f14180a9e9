"""The Python client library.

    from txbroker.client import Message, Producer, TransactionProducer, TransactionListener, LocalTransactionState

Every class has an asyncio form (Async...) and a blocking form that runs the asyncio one on a
background event loop. Each takes `credentials=` and `tls=` for brokers that require them
(client/security.py).
"""

from txbroker.client.consumer import AsyncPullConsumer, PullConsumer, PullResult
from txbroker.client.errors import (
    AuthenticationError, BrokerError, BrokerUnavailable, ClientError, DecisionNotReplicated, RequestTimeout,
    TlsHandshakeError, TlsRequired,
)
from txbroker.client.job import AsyncJobCoordinator, JobCoordinator, JobInfo
from txbroker.client.producer import AsyncProducer, Producer, SendResult, hash_selector, key_selector
from txbroker.client.push import (
    AsyncPushConsumer, ConsumeContext, ConsumeFrom, ConsumeOrderlyStatus, ConsumeStatus, MessageModel, PushConsumer,
)
from txbroker.client.security import Credentials, TlsConfig
from txbroker.client.transaction import AsyncTransactionProducer, TransactionListener, TransactionProducer
from txbroker.client.transaction_session import (
    LocalTransactionState, Prepared, TransactionSendResult, TransactionSession,
)
from txbroker.protocol.bodies import Message, MessageExt
from txbroker.client.cluster import (  # noqa: E402 - built on the single-group clients above
    AsyncClusterJobCoordinator, AsyncClusterProducer, AsyncClusterPushConsumer, AsyncClusterTransactionProducer,
    ClusterJob, ClusterJobCoordinator, ClusterProducer, ClusterPushConsumer, ClusterTransactionProducer,
)

__all__ = [
    "AsyncJobCoordinator", "JobCoordinator", "JobInfo",
    "AuthenticationError", "Credentials", "TlsConfig", "TlsHandshakeError", "TlsRequired",
    "AsyncProducer", "AsyncPullConsumer", "AsyncPushConsumer", "ConsumeContext", "ConsumeFrom",
    "ConsumeOrderlyStatus", "ConsumeStatus", "MessageModel", "PushConsumer", "hash_selector", "key_selector", "AsyncTransactionProducer", "BrokerError", "BrokerUnavailable",
    "ClientError", "DecisionNotReplicated", "LocalTransactionState", "Message", "MessageExt", "Producer", "PullConsumer", "PullResult",
    "RequestTimeout", "SendResult", "TransactionListener", "TransactionProducer", "TransactionSendResult",
    "Prepared", "TransactionSession",
    "AsyncClusterProducer", "AsyncClusterPushConsumer", "AsyncClusterTransactionProducer", "ClusterProducer",
    "ClusterPushConsumer", "ClusterTransactionProducer",
    "AsyncClusterJobCoordinator", "ClusterJob", "ClusterJobCoordinator",
]
