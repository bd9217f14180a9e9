"""Log records: the unit of durability and, later, of replication.

On-disk format, version 6 (STORE_FORMAT_VERSION, kept under meta key b"format"):

  column family  key                                  value
  log            u64 BE log sequence number (LSN)     msgpack record, tagged (see below)
  cq             topic 0x00 u16 BE queue u64 BE offset  u64 BE LSN + u32 BE index + u32 BE count:
                                                      a run of `count` messages of record LSN,
                                                      from that index, at offsets from the key's
  pending        transaction id (utf-8)               PendingTx (prepared or parked transactions)
  tx             transaction id (utf-8)               FinishedTx (committed or rolled back)
  offsets        group 0x00 topic 0x00 u16 BE queue       u64 BE next offset to consume + u64 BE LSN of the
                                                      record that set it (format 4: the offset alone)
  keys           topic 0x00 key 0x00 u64 BE LSN u32 BE index  u64 BE queue offset
  jobs           b"id/" job id | b"name/" job name   JobState (coordinated transactions, broker/transaction/jobs.py)
                 | b"decided/" u64 BE ms job id       | the newest job id opened under that name
                                                      | b"" (decided jobs in decision order: their expiry)
  meta           b"format" | b"topic/<name>" -> b"<queue count> <LSN>" | b"epoch/<u64 BE epoch>" -> start LSN
                 | b"config/group/<name>" -> JSON: a producer group's transaction settings and the
                   generation the operator applied (derived from GroupSettingsRecord)
                 | b"published" -> u64 BE LSN (a SYNC master: readable up to there)
                 | b"sendback/" group 0x00 message id 0x00 reconsume count -> u64 BE LSN of the copy
                 | b"span/" transaction id: a spanning transaction decided here whose participants
                   may still ask (until a ReleaseRecord) | b"linger/" transaction id: a decision kept
                   after retention deleted its records (store/derived/transactions.py)
                 | b"mark/", b"markclock/", b"complete_from", b"kept": retention (store/derived/marks.py)

A half message batch is stored once (HalfRecord, "under RMQ_SYS_TRANS_HALF_TOPIC"); committing it
writes queue-index entries that point at that same record plus the op record (EndRecord, "in
RMQ_SYS_TRANS_OP_HALF_TOPIC"), so the message bodies are never copied. The pending column family
holds only unfinished transactions, so the check-back scan never walks finished history.

A queue-index entry covers a run of consecutive messages of one record bound for one queue at
consecutive offsets (a request's messages to a topic share a queue), so committing a 100-message
transaction writes one entry, not 100. Format 1 wrote an entry per message (a 12-byte value
without the count); format 2 reads those as runs of one and marks such a store as format 2.
Format 3 adds GroupSettingsRecord: a producer group's settings are log records, so they replicate
and a promoted slave runs them (format 2 wrote the same meta entries directly, unreplicated; they
read the same). A format-2 broker refuses a format-3 store rather than fail on a record it cannot
decode. Format 4 adds participants (HalfRecord.home). Format 5 adds what retention and truncation
need to keep and derive again exactly: the home's list of participant groups and ReleaseRecord, the
LSN each offset and topic was set at, each pending transaction's and job's records (lineage).
Format 6 stores what a half send's messages share once: its properties common to all
(HalfRecord.properties, SEND_MESSAGE_SHARED), and in a pending transaction its messages' queues as
runs and their keys as one list (PendingTx.runs, .keys; format 5's per-message pairs are read and
rewritten so). A Spark task's member of 1,000 rows was 1,000 copies of the same properties and
2,000 small tuples held until its end.
"""

from __future__ import annotations

import itertools

import msgspec
from msgspec import Struct, field

from txbroker.protocol.bodies import JOB_ABORTED, JOB_COMMITTED, JOB_OPEN, JOB_PREPARED, Message  # noqa: F401 - re-exported
from txbroker.protocol.properties import share_properties

STORE_FORMAT_VERSION = 6  # 6: shared properties, pending runs and keys; 5: lineages, participants, ReleaseRecord
READABLE_FORMATS = frozenset({1, 2, 3, 4, 5, 6})


class HalfRecord(Struct, tag="H", array_like=True, omit_defaults=True):
    """A prepared transaction: its messages, each already bound to its real topic and queue."""

    transaction_id: str
    producer_group: str
    born_ms: int
    messages: list[Message]
    job_id: str = ""  # a member of this coordinated transaction: its decision ends this one
    home: str = ""  # a participant: the broker group whose half message of this id decides it
    participants: list[str] = field(default_factory=list)  # the home: groups holding participants of it
    # what every message carries, stored once (a message's own properties win); decode_record puts
    # them on each message, so a reader never sees a message without them
    properties: dict[str, str] = field(default_factory=dict)


class NormalRecord(Struct, tag="N", array_like=True, omit_defaults=True):
    """Plain messages, visible at once; queue_offsets[i] is messages[i]'s place in its queue.
    `send_back` names the consumer's send-back this record stores (see keys.send_back_key), so a
    retried one stores nothing new. (A broker that predates the field ignores it.)"""

    born_ms: int
    messages: list[Message]
    queue_offsets: list[int]
    send_back: bytes = b""


class EndRecord(Struct, tag="E", array_like=True, omit_defaults=True):
    """The op record: a transaction committed (offsets assigned) or rolled back."""

    transaction_id: str
    half_lsn: int
    state: int  # TransactionState.COMMIT | ROLLBACK
    end_ms: int
    queue_offsets: list[int] = field(default_factory=list)
    by: str = "producer"  # producer | check | admin


class CheckRecord(Struct, tag="C", array_like=True):
    """One check-back round: these transactions were asked about once more."""

    transaction_ids: list[str]
    check_ms: int


class ParkRecord(Struct, tag="P", array_like=True):
    """checkMax reached: the transaction moves to TRANS_CHECK_MAX_TIME_TOPIC."""

    transaction_id: str
    park_ms: int
    queue_offsets: list[int]  # in TRANS_CHECK_MAX_TIME_TOPIC, one per message


class ResumeRecord(Struct, tag="R", array_like=True):
    """An operator resumed a parked transaction: checking starts over."""

    transaction_id: str
    resume_ms: int


class JobOpenRecord(Struct, tag="J", array_like=True, omit_defaults=True):
    """A coordinated transaction (a job) opened: members may join until it is decided or its
    deadline passes (then the broker records ABORT itself)."""

    job_id: str
    producer_group: str
    open_ms: int
    deadline_ms: int
    name: str = ""  # opening by name finds the newest job of that name (replays, reruns)
    home: str = ""  # a job spanning groups, on a group that holds members: the group that decides it
    groups: list[str] = field(default_factory=list)  # at the home: the other groups that hold members
    prepared_timeout_ms: int = 0  # how long it waits for its decision once PREPARED (0: the default)


class JobPrepareRecord(Struct, tag="Q", array_like=True, omit_defaults=True):
    """The job's member list is fixed (two-phase commit's prepare): no new members; COMMIT without
    a list commits exactly these."""

    job_id: str
    members: list[str]
    prepare_ms: int
    remote: dict[str, list[str]] = field(default_factory=dict)  # the members on each other group


class JobDecisionRecord(Struct, tag="D", array_like=True, omit_defaults=True):
    """The job's decision, the commit point of all its members: COMMIT keeps exactly `members`
    (the rest roll back), ABORT keeps none. The broker then ends each member (EndRecord by "job")."""

    job_id: str
    state: int  # TransactionState.COMMIT | ROLLBACK
    decided_ms: int
    members: list[str] = field(default_factory=list)
    by: str = "client"  # client | deadline | admin | home (a group following the job's home)
    remote: dict[str, list[str]] = field(default_factory=dict)  # COMMIT: the members kept on each other group


class ReleaseRecord(Struct, tag="L", array_like=True, omit_defaults=True):
    """The home's spanning transactions whose participants have all ended: their decisions may now
    expire with the log (until then retention keeps them: a participant may still ask)."""

    transaction_ids: list[str]
    release_ms: int
    job_ids: list[str] = field(default_factory=list)  # jobs whose every group has ended its members


class TopicRecord(Struct, tag="T", array_like=True):
    name: str
    queue_count: int


class OffsetRecord(Struct, tag="O", array_like=True):
    """A consumer group's committed offsets (also the schedule service's progress)."""

    consumer_group: str
    offsets: list[tuple[str, int, int]]  # (topic, queue, next offset to consume)


class GroupSettingsRecord(Struct, tag="G", array_like=True, omit_defaults=True):
    """A producer group's transaction settings (what the operator applies from a TxProducerGroup),
    whole, as broker/transaction/settings.py merged them; empty `settings`: the group's own
    settings are removed. In the log so that slaves hold them and a failover keeps them."""

    group: str
    set_ms: int
    settings: dict = field(default_factory=dict)
    generation: int = 0


class EpochRecord(Struct, tag="X", array_like=True):
    """First record a master writes at a new epoch: marks where that epoch's records begin."""

    epoch: int
    broker_name: str
    start_ms: int


Record = (HalfRecord | NormalRecord | EndRecord | CheckRecord | ParkRecord | ResumeRecord | TopicRecord | EpochRecord
          | OffsetRecord | JobOpenRecord | JobPrepareRecord | JobDecisionRecord | GroupSettingsRecord | ReleaseRecord)

PREPARED = "PREPARED"
PARKED = "PARKED"
COMMITTED = "COMMITTED"
ROLLED_BACK = "ROLLED_BACK"


class PendingTx(Struct, array_like=True, omit_defaults=True):
    """An unfinished transaction, as the check-back service and END_TRANSACTION need it."""

    transaction_id: str
    producer_group: str
    half_lsn: int
    born_ms: int
    destinations: list[tuple[str, int]] = field(default_factory=list)  # format 5: (topic, queue) per message
    immunity_ms: int = 0  # from CHECK_IMMUNITY_TIME_IN_SECONDS; 0: the group's timeout applies
    checks: int = 0
    last_check_ms: int = 0
    state: str = PREPARED
    keyed: list[tuple[int, str]] = field(default_factory=list)  # format 5: (message index, keys)
    job_id: str = ""  # member of a coordinated transaction: never checked back, ended by its decision
    home: str = ""  # participant: never checked back, ended as its home group's transaction ended
    participants: list[str] = field(default_factory=list)  # the home of a spanning transaction: where the others are
    lineage: list[int] = field(default_factory=list)  # LSNs of its check, park and resume records
    parked_offsets: list[int] = field(default_factory=list)  # its entries in TRANS_CHECK_MAX_TIME_TOPIC
    runs: list[tuple[str, int, int]] = field(default_factory=list)  # (topic, queue, count): its messages' queues
    keys: list[str] = field(default_factory=list)  # each message's keys ("": none), to index at commit; [] if none has

    @property
    def message_count(self) -> int:
        return sum(r[2] for r in self.runs)


def runs_of(msgs) -> list[tuple[str, int, int]]:
    """(topic, queue, count) for each run of consecutive messages bound for one queue."""
    out: list[tuple[str, int, int]] = []
    topic = queue = None
    n = 0
    for m in msgs:
        if m.queue_id != queue or m.topic != topic:
            if n:
                out.append((topic, queue, n))
            topic, queue, n = m.topic, m.queue_id, 1
        else:
            n += 1
    if n:
        out.append((topic, queue, n))
    return out


def keys_of(msgs) -> list[str]:
    """Each message's keys, or [] when none has any (most sends)."""
    ks = [m.keys for m in msgs]
    return ks if any(ks) else []


class FinishedTx(Struct, array_like=True, omit_defaults=True):
    transaction_id: str
    producer_group: str
    half_lsn: int
    state: str  # COMMITTED | ROLLED_BACK
    end_lsn: int
    end_ms: int
    message_count: int
    queue_offsets: list[int] = field(default_factory=list)
    by: str = "producer"
    checks: int = 0
    job_id: str = ""
    participants: list[str] = field(default_factory=list)  # the home of a spanning transaction
    released_lsn: int = 0  # the ReleaseRecord that let this decision expire (participants all ended)
    # its entries in TRANS_CHECK_MAX_TIME_TOPIC, if it was parked: they point into its half and go
    # with it (empty in a decision written before they were kept: its park record's deletion takes them)
    parked_offsets: list[int] = field(default_factory=list)


class JobState(Struct, array_like=True, omit_defaults=True):
    """A job as the jobs column family holds it. `members`: the prepared list, then the decided one."""

    job_id: str
    producer_group: str
    open_ms: int
    deadline_ms: int
    open_lsn: int
    name: str = ""
    state: str = JOB_OPEN
    members: list[str] = field(default_factory=list)
    decided_ms: int = 0
    by: str = ""
    decision_lsn: int = 0
    prepare_lsn: int = 0
    ended_lsn: int = 0  # the end of its last member (0: members still pending, or none yet)
    previous: str = ""  # the job its name named before this one opened (a truncation goes back to it)
    home: str = ""  # a job spanning groups, on a group that holds members: the group that decides it
    groups: list[str] = field(default_factory=list)  # at the home: the other groups that hold members
    remote: dict[str, list[str]] = field(default_factory=dict)  # the members on other groups (prepared, kept)
    prepared_timeout_ms: int = 0
    prepared_deadline_ms: int = 0  # a PREPARED job: aborted undecided from then on
    released_lsn: int = 0  # every other group has ended its members: the decision may expire

    @property
    def spans(self) -> bool:
        return bool(self.groups)

    @property
    def decided(self) -> bool:
        return self.state in (JOB_COMMITTED, JOB_ABORTED)


encode = msgspec.msgpack.Encoder().encode
_record_decoder = msgspec.msgpack.Decoder(Record)
_pending_decoder = msgspec.msgpack.Decoder(PendingTx)
_finished_decoder = msgspec.msgpack.Decoder(FinishedTx)
_job_decoder = msgspec.msgpack.Decoder(JobState)


def decode_record(data: bytes) -> Record:
    r = _record_decoder.decode(data)
    if type(r) is HalfRecord and r.properties:
        share_properties(r.messages, r.properties)
    return r


def decode_pending(data: bytes) -> PendingTx:
    p = _pending_decoder.decode(data)
    if p.destinations:  # written by format 5: a pair per message
        p.runs = [(t, q, len(list(g))) for (t, q), g in itertools.groupby(p.destinations)]
        if p.keyed:
            p.keys = [""] * len(p.destinations)
            for i, text in p.keyed:
                p.keys[i] = text
        p.destinations, p.keyed = [], []
    return p


def decode_finished(data: bytes) -> FinishedTx:
    return _finished_decoder.decode(data)


def decode_job(data: bytes) -> JobState:
    return _job_decoder.decode(data)
