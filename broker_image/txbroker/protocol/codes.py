"""Request and response codes, numbered as Apache RocketMQ numbers them where it has one.

Keeping RocketMQ's names and numbers lets users read our logs and metrics with the vocabulary
(and dashboards) they already have.
"""

from enum import IntEnum


class RequestCode(IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    VIEW_MESSAGE_BY_ID = 33
    HEARTBEAT = 34
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106  # the cluster route: its broker groups (protocol/cluster.py)
    # Replication between brokers (RocketMQ runs its HA service on a port of its own; ours shares
    # the data plane's framing and port).
    REPLICATION_SUBSCRIBE = 900  # slave -> master: send me records from LSN n
    REPLICATION_PUSH = 901  # master -> slave, one-way: records
    REPLICATION_ACK = 902  # slave -> master, one-way: durable up to LSN n
    REPLICATION_SNAPSHOT = 903  # slave -> master: a consistent copy of the store, file by file (a seed)
    # Authentication (RocketMQ's remoting signs each request instead; see broker/auth/__init__.py):
    # one SCRAM exchange per connection, two round trips, before any other request.
    SASL_AUTHENTICATE = 910
    # Coordinated transactions (jobs; broker/transaction/jobs.py): no RocketMQ counterpart. Kafka keeps such a
    # decision in its transaction coordinator; here it is a record in the broker's own log.
    OPEN_JOB = 920
    PREPARE_JOB = 921
    DECIDE_JOB = 922
    QUERY_JOB = 923
    # a job's members on another group ask its home how the job's decision treats them
    QUERY_JOB_MEMBERS = 924
    # a reader across groups: which jobs spanning groups are decided here but not yet visible everywhere
    QUERY_JOBS_SETTLED = 925
    # Broker groups (protocol/cluster.py): a participant of a transaction that spans groups asks the
    # group that decides it (its home) how it ended.
    QUERY_TRANSACTION_STATES = 930
    # SEND_MESSAGE whose messages share one properties map, sent once (SendRequest.properties): a
    # Spark task's rows all carry the same job, task and attempt. A code of its own, not a new
    # field under SEND_MESSAGE: a broker that predates it refuses the code (the client then sends
    # SEND_MESSAGE) instead of ignoring the field and storing the messages without their properties.
    SEND_MESSAGE_SHARED = 940


class ResponseCode(IntEnum):
    # RocketMQ's numbers; the gaps are its codes this broker never answers.
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    # A commit arrived for a transaction that was already rolled back, or the reverse.
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_GROUP_WRONG = 203
    ILLEGAL_OPERATION = 604
    # The broker was master at an older epoch and has been deposed.
    CONTROLLER_FENCED_MASTER_EPOCH = 2003
    # Security refusals. UNAUTHORIZED is RocketMQ 5's name and number for "who are you?" (no,
    # wrong, expired or revoked credentials); "you may not" is NO_PERMISSION (16), as its ACL answers.
    UNAUTHORIZED = 40100
    TLS_REQUIRED = 40101  # a plaintext connection to a port that accepts TLS only
    # A master refuses a slave that cannot read the store format it writes (broker/replication/compat.py);
    # no RocketMQ counterpart (its HA service does not compare versions).
    REPLICATION_INCOMPATIBLE = 40200


class TransactionState(IntEnum):
    """What a producer answers for its local transaction (END_TRANSACTION's commitOrRollback)."""

    UNKNOWN = 0
    COMMIT = 1
    ROLLBACK = 2


def code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"CODE_{code}"
