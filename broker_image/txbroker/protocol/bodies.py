"""Request and response bodies, one msgspec Struct each, encoded as compact msgpack arrays.

Fields are positional on the wire (array_like), so new optional fields go at the end with a
default; that keeps old peers able to decode new frames.
"""

from __future__ import annotations

import threading

import msgspec
from msgspec import Struct, field


# Messages are made and decoded by the hundred thousand (a Spark task, a batch send, a pull) and
# hold only strings, bytes and a dict of strings, so they can never be part of a reference cycle:
# gc=False keeps them out of the garbage collector, whose full passes over that many live objects
# cost more than building them (a Spark task's rows: 1.25 us per message tracked, 0.07 untracked).
class Message(Struct, array_like=True, omit_defaults=True, gc=False):
    """A message as a producer sends it. `queue_id` -1 lets the broker choose the queue."""

    topic: str
    body: bytes
    tags: str = ""
    keys: str = ""  # space-separated, as RocketMQ's KEYS property
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = -1
    transaction_id: str = ""  # set by the client once the half message is stored; not sent


class MessageExt(Struct, array_like=True, omit_defaults=True, gc=False):
    """A stored message as a reader sees it."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    tags: str = ""
    keys: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp: int = 0  # ms
    store_timestamp: int = 0  # ms
    transaction_id: str = ""
    reconsume_times: int = 0


class ErrorBody(Struct, array_like=True):
    remark: str


class SendRequest(Struct, array_like=True, omit_defaults=True):
    """SEND_MESSAGE. A non-empty transaction_id makes the messages one half-message transaction."""

    producer_group: str
    messages: list[Message]
    transaction_id: str = ""
    job_id: str = ""  # a half message that joins this coordinated transaction (OPEN_JOB)
    # a participant of a transaction that spans broker groups: the group whose half message of the
    # same transaction id decides it (protocol/cluster.py); this broker resolves it from there
    home: str = ""
    # the home of such a transaction: the groups holding its participants (the home keeps its
    # decision until every one of them has ended)
    participants: list[str] = []
    # SEND_MESSAGE_SHARED only: properties every message carries (a message's own win over them)
    properties: dict[str, str] = {}


class SendResponse(Struct, array_like=True, omit_defaults=True):
    msg_ids: list[str]
    queue_ids: list[int] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)  # empty for half messages
    transaction_id: str = ""
    commit_log_offset: int = 0  # where the half message is stored
    duplicate: bool = False  # the transaction id was already prepared: nothing new was stored


class EndTransactionRequest(Struct, array_like=True, omit_defaults=True):
    producer_group: str
    transaction_id: str
    state: int  # TransactionState
    commit_log_offset: int = 0  # 0: look the transaction up by id only
    from_transaction_check: bool = False


class EndTransactionResponse(Struct, array_like=True, omit_defaults=True):
    state: int  # the transaction's final state (TransactionState), or UNKNOWN if still pending
    already: bool = False  # the transaction had already reached this state: nothing changed
    queue_offsets: list[int] = field(default_factory=list)


class CheckTransactionStateRequest(Struct, array_like=True, omit_defaults=True):
    """Broker to producer, one-way: what became of this transaction?"""

    producer_group: str
    transaction_id: str
    commit_log_offset: int
    message: MessageExt
    check_times: int = 0
    message_count: int = 1


class HeartbeatRequest(Struct, array_like=True, omit_defaults=True):
    client_id: str
    producer_groups: list[str] = field(default_factory=list)
    consumer_groups: list[str] = field(default_factory=list)
    # The newest master this client knows of: a master at a lower epoch checks it and fences itself.
    master_epoch: int = 0
    master_address: str = ""


class ConsumerListRequest(Struct, array_like=True):
    consumer_group: str


class ConsumerListResponse(Struct, array_like=True):
    client_ids: list[str]


class QueueOffset(Struct, array_like=True):
    topic: str
    queue_id: int
    offset: int


class CommitOffsetsRequest(Struct, array_like=True, omit_defaults=True):
    """UPDATE_CONSUMER_OFFSET for many queues at once."""

    consumer_group: str
    offsets: list[QueueOffset]
    # a push consumer's progress: never lowers what the group has (RocketMQ's increaseOnly, kept by
    # the broker, where two members' commits meet); without it an offset is set as given
    only_forward: bool = False


class QueryOffsetsRequest(Struct, array_like=True):
    consumer_group: str
    topic: str


class QueryOffsetsResponse(Struct, array_like=True):
    offsets: dict[int, int]  # queue -> committed offset (absent: never committed)
    max_offsets: dict[int, int]


class SendBackRequest(Struct, array_like=True, omit_defaults=True):
    """CONSUMER_SEND_MSG_BACK: consume later (retry topic, with delay) or, past the maximum, DLQ."""

    consumer_group: str
    msg_id: str
    topic: str  # where the consumer got it (the original topic or %RETRY%group)
    reconsume_times: int  # times consumed so far and failed, including this one
    max_reconsume_times: int = 16
    # the consumer's copy, sent again when the broker no longer held the message (retention deleted
    # it while the consumer had it): stored in its place, as RocketMQ's consumer sends it itself
    message: Message | None = None


class SendBackResponse(Struct, array_like=True):
    destination: str  # %RETRY%group or %DLQ%group
    delay_ms: int


class LockQueuesRequest(Struct, array_like=True, omit_defaults=True):
    consumer_group: str
    client_id: str
    topic: str
    queue_ids: list[int]
    lease_ms: int = 60_000


class LockQueuesResponse(Struct, array_like=True):
    locked: list[int]


class SearchOffsetRequest(Struct, array_like=True):
    topic: str
    queue_id: int
    timestamp_ms: int


class SearchOffsetResponse(Struct, array_like=True):
    offset: int


class QueryByKeyRequest(Struct, array_like=True, omit_defaults=True):
    topic: str
    key: str
    max_messages: int = 32


class QueryByKeyResponse(Struct, array_like=True):
    messages: list[MessageExt]


class HeartbeatResponse(Struct, array_like=True, omit_defaults=True):
    broker_name: str
    role: str
    epoch: int = 0
    master: str = ""  # where the master is, as this broker knows it


class PullRequest(Struct, array_like=True, omit_defaults=True):
    topic: str
    queue_id: int
    offset: int
    max_messages: int = 32
    max_wait_ms: int = 0  # long-poll: wait up to this long for a message to become visible
    consumer_group: str = ""
    tags: str = ""  # subscription expression: "" or "*" for all, or "TagA || TagB"


class PullResponse(Struct, array_like=True, omit_defaults=True):
    messages: list[MessageExt]
    next_offset: int
    min_offset: int = 0
    max_offset: int = 0


class NotifyConsumersChanged(Struct, array_like=True):
    consumer_group: str


class TransactionStatesRequest(Struct, array_like=True):
    """QUERY_TRANSACTION_STATES: how these transactions stand on this broker, as published."""

    producer_group: str
    transaction_ids: list[str]


class TransactionStatesResponse(Struct, array_like=True):
    states: list[str]  # per id: PREPARED, PARKED, COMMITTED, ROLLED_BACK, or UNKNOWN (no such transaction)


class RouteRequest(Struct, array_like=True):
    topic: str


class RouteResponse(Struct, array_like=True, omit_defaults=True):
    topic: str
    queue_count: int
    broker_name: str = ""
    role: str = ""
    epoch: int = 0


class CreateTopicRequest(Struct, array_like=True, omit_defaults=True):
    topic: str
    queue_count: int = 0  # 0: the broker's default


class ViewMessageRequest(Struct, array_like=True):
    msg_id: str


class ReplicaSubscribe(Struct, array_like=True, omit_defaults=True):
    slave_name: str
    next_lsn: int  # first record the slave needs
    epoch: int  # the highest epoch in the slave's log
    address: str = ""  # the slave's own data-plane address, for status
    # Every (epoch, first LSN) of the slave's log: the master finds the last one both logs share
    # and so where they part (KIP-101/279). A slave that sends none is compared by `epoch` alone.
    epochs: list[tuple[int, int]] = []
    # What the slave runs (broker/replication/compat.py): its software version, the store format it
    # writes and those it reads. Brokers before 0.2.0 send none of them (a master ignores what it
    # does not know, so an older master reads this as before).
    version: str = ""
    store_format: int = 0
    reads: list[int] = []


class ReplicaWelcome(Struct, array_like=True, omit_defaults=True):
    master_epoch: int
    truncate_after: int = -1  # >= 0: drop records after this LSN first, then subscribe again
    version: str = ""  # the master's software version and the store format it writes (none before 0.2.0)
    store_format: int = 0


class ReplicaRecords(Struct, array_like=True):
    first_lsn: int
    records: list[bytes]
    master_epoch: int
    published: int = -1  # the master's published LSN: a slave serves no further (-1: an older master's)


class SnapshotRequest(Struct, array_like=True, omit_defaults=True):
    """REPLICATION_SNAPSHOT: `begin` a consistent copy of the master's store (a RocksDB checkpoint),
    `read` its files chunk by chunk, `end` it (the master drops the copy)."""

    action: str  # begin | read | end
    snapshot_id: str = ""
    name: str = ""  # read: the file
    offset: int = 0
    length: int = 0


class SnapshotResponse(Struct, array_like=True, omit_defaults=True):
    snapshot_id: str = ""
    files: list[tuple[str, int]] = []  # begin: (name, size) of every file of the copy
    data: bytes = b""  # read: the chunk
    last_lsn: int = 0  # begin: the copy's last log record


class ReplicaAck(Struct, array_like=True):
    durable_lsn: int
    epoch: int


class OpenJobRequest(Struct, array_like=True, omit_defaults=True):
    """OPEN_JOB: a coordinated transaction, aborted by the broker if undecided at the deadline.
    With a `name`, the newest job of that name is answered while it is open, prepared or committed
    (a rerun or a replayed micro-batch finds it); after an abort a new one is opened."""

    producer_group: str
    timeout_ms: int  # the deadline, from now (of an OPEN job: a PREPARED one has prepared_timeout_ms)
    name: str = ""
    # a job spanning broker groups: at its home, the other groups that will hold members ...
    groups: list[str] = []
    # ... and on each of those, the job's entry there: the home's job id and the home group
    job_id: str = ""
    home: str = ""
    prepared_timeout_ms: int = 0  # how long a PREPARED job waits for its decision (0: 24 h)


class PrepareJobRequest(Struct, array_like=True):
    """PREPARE_JOB: fix the member list (no new members); a later COMMIT without a list keeps it."""

    producer_group: str
    job_id: str
    members: list[str]
    remote: dict[str, list[str]] = {}  # a job spanning groups: the members on each other group


class DecideJobRequest(Struct, array_like=True, omit_defaults=True):
    """DECIDE_JOB: COMMIT (1) keeping exactly `members` (None: the prepared list), or ABORT (2).
    The first decision wins; the broker ends every member itself."""

    producer_group: str
    job_id: str
    state: int  # TransactionState.COMMIT | ROLLBACK
    members: list[str] | None = None
    # a job spanning groups: the members kept on each other group (sent to a group that is not the
    # job's home, DECIDE_JOB makes it ask the home now, and answers as it then stands)
    remote: dict[str, list[str]] | None = None


class QueryJobRequest(Struct, array_like=True, omit_defaults=True):
    producer_group: str
    job_id: str = ""
    name: str = ""  # or the newest job of this name


# A job's states, as JobInfo.state and the jobs column family say them.
JOB_OPEN = "OPEN"
JOB_PREPARED = "PREPARED"
JOB_COMMITTED = "COMMITTED"
JOB_ABORTED = "ABORTED"


class JobInfo(Struct, array_like=True, omit_defaults=True):
    """A job as the broker holds it; the answer to every job request."""

    job_id: str
    producer_group: str
    state: str  # OPEN | PREPARED | COMMITTED | ABORTED
    open_ms: int
    deadline_ms: int
    name: str = ""
    members: int = 0  # prepared or decided members (COMMIT: those kept)
    pending: int = 0  # members not yet ended (a decided job: being resolved)
    decided_ms: int = 0
    by: str = ""  # who decided: client | deadline | admin
    already: bool = False  # this request changed nothing: the job was already so
    resolved: bool = False  # decided, and every member's end written and published (at the home: on every group)
    home: str = ""  # a job spanning groups, on a group that holds members: the group that decides it
    groups: list[str] = []  # at the home: the other groups that hold members
    prepared_deadline_ms: int = 0  # a PREPARED job: when the broker aborts it, undecided
    unresolved_groups: list[str] = []  # at the home: groups whose members have not yet all ended as decided


class JobMembersRequest(Struct, array_like=True):
    """QUERY_JOB_MEMBERS: a group holding members of a job that spans groups asks the job's home how
    its decision treats them (answered by the home's master, as published)."""

    producer_group: str
    job_id: str
    group: str  # the asking group
    transaction_ids: list[str]


class JobsSettledRequest(Struct, array_like=True):
    """QUERY_JOBS_SETTLED (to a group's master): a reader across groups plans its end offsets where no
    job spanning groups is visible on some of them and not on others."""


class JobsSettledResponse(Struct, array_like=True):
    newest_decision_lsn: int  # the newest decision of a job spanning groups decided here (its home), published
    unsettled: list[str]  # jobs decided here, published, not yet resolved (visible) on every group they span


class JobMembersResponse(Struct, array_like=True):
    state: str  # the job at the home, as published: OPEN | PREPARED | COMMITTED | ABORTED | UNKNOWN (no such job)
    kept: list[bool]  # COMMITTED: per id, whether the decision keeps it


class SaslRequest(Struct, array_like=True):
    """SASL_AUTHENTICATE: one step of a SCRAM exchange (client-first, then client-final message)."""

    mechanism: str  # "SCRAM-SHA-256"
    payload: str


class SaslResponse(Struct, array_like=True, omit_defaults=True):
    payload: str  # server-first, then server-final (the client checks the server's signature)
    done: bool = False  # the connection is authenticated as `access_key`
    access_key: str = ""


# What decoding a body can raise: msgspec's errors, and UnicodeDecodeError, which msgspec raises
# as it is for a string that is not valid UTF-8 (found by the property tests).
BODY_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)

_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode

_decoders: dict[type, msgspec.msgpack.Decoder] = {}
_decoders_made = threading.Lock()   # one for every typed decoder of the process: Structs are shared


def decoder(kind: type) -> msgspec.msgpack.Decoder:
    dec = _decoders.get(kind)
    if dec is None:
        dec = typed_decoder(_decoders, msgspec.msgpack.Decoder, kind)
    return dec


def typed_decoder(cache: dict, make, kind):
    """`make(kind)`, made once per kind in `cache`, one at a time in the process. msgspec (0.22)
    fills in a Struct's type information on its first use and publishes it half-filled while it
    does: a second thread decoding the same Struct then dereferences a null field type and the
    process dies of SIGSEGV (the console, whose requests to the brokers run in threads, on a loaded
    host). A decoder made here is complete before any thread decodes with it."""
    with _decoders_made:
        dec = cache.get(kind)
        if dec is None:
            dec = cache[kind] = make(kind)
    return dec


def decode(kind: type, data: bytes):
    """Decode `data` as `kind`; raises one of BODY_ERRORS (msgspec's name the bad field)."""
    return decoder(kind).decode(data)
