"""The admin plane's answers (the JSON of /api/v1/...), defined once: the broker builds them, and
the operator, the CLI, Spark, the chaos harness and the bench decode them.

Decoding is strict about what a reader relies on (a required field missing or of another type is an
error, `msgspec.ValidationError`) and lenient about what it does not know (a newer broker's extra
fields are ignored), as Strimzi's typed model is. A reader that cannot decode an answer has met a
broker of another version: the operator reports that as incompatible, never as a dead broker.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct, field

from txbroker.protocol.bodies import JobInfo


class SettingsError(ValueError):
    """Transaction settings that cannot be used; the message names the setting."""


class TransactionSettings(Struct, forbid_unknown_fields=True):
    """A broker's transaction defaults, or a producer group's own (PUT /api/v1/config/transaction,
    PUT /api/v1/groups/{group}/transaction, and the broker config's [transaction] table)."""

    check_interval_ms: int = 60_000  # RocketMQ's transactionCheckInterval (the seeds' 60 s)
    timeout_ms: int = 6_000  # transactionTimeOut: a half message younger than this is not checked
    check_max: int = 15  # transactionCheckMax: checks before parking in TRANS_CHECK_MAX_TIME_TOPIC
    # CHECK_IMMUNITY_TIME for messages that carry none (0: timeout_ms); waiting it out burns no check
    default_immunity_ms: int = 0
    # check-back through an HTTP webhook instead of a producer connection (TxProducerGroup checkMode http)
    webhook_url: str = ""
    # Every half message of the group must join a coordinated transaction (TxProducerGroup
    # checkMode ledger): the broker answers for them from the job's decision; others are refused.
    require_job: bool = False

    def validate(self, where: str = "transaction") -> "TransactionSettings":
        if self.default_immunity_ms < 0:
            raise SettingsError(f"{where}.default_immunity_ms must not be negative, got {self.default_immunity_ms}")
        if self.webhook_url and not self.webhook_url.startswith(("http://", "https://")):
            raise SettingsError(f"{where}.webhook_url must be an http:// or https:// URL, got {self.webhook_url!r}")
        if self.check_interval_ms < 100:
            raise SettingsError(f"{where}.check_interval_ms must be at least 100, got {self.check_interval_ms}")
        if self.timeout_ms < 0:
            raise SettingsError(f"{where}.timeout_ms must not be negative, got {self.timeout_ms}")
        if not 1 <= self.check_max <= 10_000:
            raise SettingsError(f"{where}.check_max must be between 1 and 10000, got {self.check_max}")
        return self

    def merged(self, changes: dict, where: str) -> "TransactionSettings":
        """These settings with `changes` (a partial object, as an admin PUT or flags give) applied."""
        if not isinstance(changes, dict):
            raise SettingsError(f"{where}: expected an object of settings")
        try:
            merged = msgspec.convert({**msgspec.to_builtins(self), **changes}, TransactionSettings)
        except msgspec.ValidationError as e:
            raise SettingsError(f"{where}: {e}") from None
        return merged.validate(where)


class GroupSettings(TransactionSettings, kw_only=True, forbid_unknown_fields=False):
    """A producer group's settings as a broker runs them (GET /api/v1/groups maps group -> this),
    with the generation of the TxProducerGroup the operator applied (0: applied by hand)."""

    generation: int = 0


class SlaveLink(Struct):
    """A master's view of one slave's replication link."""

    name: str
    address: str
    acknowledged_offset: int
    lag: int  # records the slave has not acknowledged
    in_sync: bool  # caught up and following live (a SYNC write counts it)
    version: str = ""  # the slave's software version ("": before 0.2.0, which did not say)
    store_format: int = 0  # the store format the slave writes (0: it did not say)


class Replication(Struct):
    """A master: `mode`, `sync_replicas` and its `slaves`; a slave: its `master` and whether it is
    `connected` to it, how far it has replicated and the last error."""

    mode: str = ""
    sync_replicas: int = 0
    slaves: list[SlaveLink] = field(default_factory=list)
    master: str = ""
    connected: bool = False
    replicated_offset: int = 0
    last_error: str = ""
    # Replication refused because the two brokers' versions cannot work together (a slave that cannot
    # read its master's store format): why, naming both. A master lists the slaves it refused lately.
    incompatible: str = ""
    master_version: str = ""  # a slave: its master's software version and store format, as it said
    master_store_format: int = 0
    # a master: the slaves recorded as possibly holding what it acknowledged at its epoch (a restart's
    # probation waits for each; DELETE /api/v1/replication/slaves/NAME forgets one gone for good)
    recorded_slaves: list[str] = field(default_factory=list)
    # a master under a controller: the slaves whose acknowledgements count for a SYNC write, as the
    # controller approved them (PUT /api/v1/replication/sync-set); None: every subscribed slave counts
    sync_set: list[str] | None = None


class AuthStatus(Struct):
    file: str
    users: int
    loaded_at: float
    reloads: int
    last_error: str = ""


class Security(Struct):
    auth: AuthStatus | None
    tls: bool
    client_certificates: bool


class Limits(Struct):
    max_connections: int
    max_unacked_bytes: int
    unacked_bytes: int
    idle_timeout_ms: int
    max_inflight_per_connection: int


class BrokerInfo(Struct):
    """GET /api/v1/broker (and the answer to POST /api/v1/role): who this broker is and where its
    log stands. Offsets are log sequence numbers (LSNs)."""

    broker_name: str
    version: str
    role: str  # master | slave
    epoch: int
    master: str  # a slave's master (HOST:PORT); empty on a master
    log_end_offset: int  # last LSN written
    durable_offset: int  # last LSN published (readable)
    local_durable_offset: int  # last LSN written to the local disk (ASYNC flush: maybe not fsynced yet)
    log_start_offset: int  # retention deleted (most) records before this
    flush_disk_type: str
    pending_transactions: int
    parked_transactions: int
    topics: int
    connections: int
    producer_groups: dict[str, int]  # live producers per group
    consumer_groups: dict[str, list[str]]  # client ids per group
    recovery_seconds: float
    fenced_by: int  # a deposed master: the epoch that deposed it
    replication: Replication
    security: Security
    limits: Limits
    retention_mark_offset: int = 0  # the log end at retention's newest mark: what a later pass may delete up to
    synced_offset: int = 0  # last LSN fsynced to the local disk (ASYNC flush: a power loss keeps this much)
    probation: str = ""  # a restarted master taking no write until a slave shows it lost nothing: why
    unconfirmed: str = ""  # a restarted master taking no write until its controller confirms it: why
    stepped_down: str = ""  # a master that gave up its role (it lost records its slaves have): why
    store_format: int = 0  # the store format this broker writes (STORE_FORMAT_VERSION; 0: before 0.2.0)
    readable_formats: list[int] = field(default_factory=list)  # the store formats it opens (older ones upgraded)
    handover: str = ""  # a master handing over to a successor (a switchover): to whom; it takes no write meanwhile


class Handover(Struct):
    """The answer to POST /api/v1/handover: the master handed over to `successor` at log offset
    `offset` (the successor holds everything up to there) and is now its slave."""

    successor: str
    epoch: int
    offset: int
    broker: BrokerInfo


class TopicSummary(Struct):
    name: str
    queues: int


class TopicList(Struct):
    topics: list[TopicSummary]


class QueueInfo(Struct):
    queue_id: int
    max_offset: int  # offsets below this are published


class TopicInfo(Struct):
    name: str
    queues: list[QueueInfo]


class TopicCreated(Struct):
    name: str
    queues: int
    created: bool  # False: it existed with at least that many queues


class PendingTransaction(Struct):
    """A transaction still prepared (PREPARED) or parked after check_max checks (PARKED)."""

    transaction_id: str
    producer_group: str
    state: str
    commit_log_offset: int  # the half record's LSN
    born_ms: int
    messages: int
    checks: int
    last_check_ms: int
    immunity_ms: int
    job_id: str = ""
    home: str = ""  # a participant of a transaction spanning broker groups: the group that decides it
    participants: list[str] = field(default_factory=list)  # the home of one: where its participants are


class TransactionList(Struct):
    total: int  # matching, before the limit
    transactions: list[PendingTransaction]


class MessagePreview(Struct):
    topic: str
    queue_id: int
    tags: str
    keys: str
    properties: dict[str, str]
    body_preview: str


class Transaction(Struct, kw_only=True):
    """GET /api/v1/transactions/{id}: a pending one (as PendingTransaction) or a finished one
    (COMMITTED | ROLLED_BACK, with how and when it ended)."""

    transaction_id: str
    producer_group: str
    state: str
    commit_log_offset: int
    messages: int
    message_ids: list[str]
    born_ms: int = 0
    checks: int = 0
    last_check_ms: int = 0
    immunity_ms: int = 0
    job_id: str = ""
    end_lsn: int = 0
    end_ms: int = 0
    queue_offsets: list[int] = field(default_factory=list)
    by: str = ""  # who ended it: producer | check | admin | job | home
    first_message: MessagePreview | None = None
    home: str = ""  # a participant of a transaction spanning broker groups: the group that decides it
    participants: list[str] = field(default_factory=list)  # the home of one: where its participants are


class TransactionAction(Struct):
    """The answer to POST /api/v1/transactions/{id}/commit|rollback|resume."""

    transaction_id: str
    state: str
    already: bool  # it was already so: nothing changed
    warning: str = ""  # what a forced end of a participant tears


class Job(JobInfo, array_like=False, omit_defaults=False):
    """A coordinated transaction as the admin plane shows it (the JSON form of the wire's JobInfo)."""


class JobDetail(Job, kw_only=True):
    """GET /api/v1/jobs/{id}: the job and its member transaction ids: `member_ids` on this group;
    at the home of a job spanning groups, `remote_member_ids` the members on each other group it was
    prepared (or committed) with (an OPEN job's are known to their own group only: its entry there)."""

    member_ids: list[str] = field(default_factory=list)
    remote_member_ids: dict[str, list[str]] = field(default_factory=dict)


class JobList(Struct):
    total: int
    jobs: list[Job]


class ScanResult(Struct):
    pending: int
    checked: int
    parked: int
    without_producer: int
    seconds: float


class StoredMessage(Struct):
    """GET /api/v1/messages/{id}: a stored message, visible or not."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    tags: str
    keys: str
    properties: dict[str, str]
    born_timestamp: int
    transaction_id: str
    transaction_state: str  # PREPARED | PARKED | COMMITTED | ROLLED_BACK, or empty (not transactional)
    visible: bool
    body: str
    body_size: int


class Connection(Struct):
    peer: str
    client_id: str
    tls: bool
    access_key: str | None
    requests_in_flight: int
    bytes_in_flight: int
    write_buffer_bytes: int
    reading_paused: bool
    peer_not_reading: bool
    idle_seconds: float
    replica: bool


class ConnectionList(Struct):
    connections: list[Connection]


class Identity(Struct):
    """GET /api/v1/whoami: who the credentials are, and what they may do on the admin API
    (any authenticated user may ask). Without authentication on the broker, everyone may do all."""

    access_key: str  # empty: the broker requires no authentication
    authenticated: bool
    admin: bool  # every admin request, reads and writes (and every data-plane right)
    monitor: bool  # the admin API's reads (GET) only


class ErrorAnswer(Struct):
    """Any refusal: HTTP 4xx/5xx with the broker's message and a code (RocketMQ's names, or
    MALFORMED, INVALID_CONFIG, CLIENT_CERTIFICATE_REQUIRED)."""

    error: str
    code: str = ""


def encode(answer: Any) -> bytes:
    return _encoder.encode(answer)


_encoder = msgspec.json.Encoder()


class ClusterInfo(Struct):
    """GET /api/v1/cluster: this broker's group and the cluster route it serves (protocol/cluster.py)."""

    group: str  # "" outside any cluster of broker groups
    route: dict | None = None  # cluster, version, groups (name, addresses, state)
    draining: bool = False


class DrainStatus(Struct):
    """GET /api/v1/drain: what this group still holds for someone (its master's view, as published).
    A group may go once `drained`: nothing undelivered and no transaction pending or parked."""

    group: str
    draining: bool
    undelivered: int  # messages some consumer group (or nobody yet) has not consumed; delayed ones waiting
    topics: dict[str, int]  # the undelivered per topic (retry and dead-letter topics included)
    pending_transactions: int  # pending or parked (a participant waits on its home)
    drained: bool
    # participants held here whose home is another group, and jobs whose members here wait for their
    # home's decision, by that group: a group may only leave the cluster once nothing of another group
    # waits on it (each asks it how its transaction or job ended)
    waiting_on: dict[str, int] = msgspec.field(default_factory=dict)
    undecided_jobs: int = 0  # jobs whose home is here, not decided yet (their decision is taken here)
    # jobs whose home is here, decided, that some group they span has not followed yet (it asks here)
    unreleased_jobs: int = 0
    # spanning transactions decided here whose participants have not all ended, as their groups'
    # masters publish it (a participant would ask here how its transaction ended)
    unreleased_decisions: int = 0
