"""The data source's options, checked on the driver before any task runs.

Every error names the option (`txbroker option 'topic': ...`), so a misconfigured job fails at
`save()` / `start()` / `load()` with a message that says what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from txbroker.protocol.names import TOPIC_NAME, TOPIC_NAME_RULE

from txbroker_spark.faults import FAIL_MODES, HANG_POINTS, FaultPlan
from txbroker_spark.option_values import OptionError, option_value
from txbroker_spark.security import BrokerSecurity, parse_security

MAX_TOTAL_BODY = 4 * 1024 * 1024  # the broker's default max_message_size (per request)

# Message properties every published message carries (which job, task and batch sent it).
P_KIND = "SPARK_KIND"  # batch | stream
P_JOB = "SPARK_JOB_ID"
P_PARTITION = "SPARK_PARTITION"
P_ATTEMPT = "SPARK_TASK_ATTEMPT"
P_QUERY = "SPARK_QUERY_ID"
P_BATCH = "SPARK_BATCH_ID"


def _int(options, name: str, default: int, lo: int, hi: int) -> int:
    raw = option_value(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(name, f"expected an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise OptionError(name, f"must be between {lo} and {hi}, got {value}")
    return value


def _float(options, name: str, default: float, lo: float, hi: float) -> float:
    raw = option_value(options, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise OptionError(name, f"expected a number, got {raw!r}") from None
    if not lo <= value <= hi:
        raise OptionError(name, f"must be between {lo} and {hi}, got {value}")
    return value


def _security(options) -> BrokerSecurity:
    """accessKey, secretKey / secretKeyFile, tls* (or the TXBROKER_* environment), checked now: files
    readable and loadable on the driver."""
    sec = parse_security(options)
    sec.check_files()
    return sec


def parse_brokers(options) -> list[str]:
    raw = option_value(options, "brokers")
    if raw is None:
        raise OptionError("brokers", "is required: the broker addresses, HOST:PORT[,HOST:PORT...]")
    out = [b.strip() for b in raw.replace(";", ",").split(",") if b.strip()]
    for b in out:
        host, sep, port = b.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError("brokers", f"each address must be HOST:PORT, got {b!r}")
    if not out:
        raise OptionError("brokers", "is required: the broker addresses, HOST:PORT[,HOST:PORT...]")
    return out


def parse_topic(options) -> str:
    topic = option_value(options, "topic")
    if topic is None:
        raise OptionError("topic", "is required: the topic to publish to / read from")
    if not TOPIC_NAME.match(topic):
        raise OptionError("topic", f"invalid topic name {topic!r}: use {TOPIC_NAME_RULE}")
    return topic


def _column(schema, options, name: str) -> tuple[str, str] | None:
    """(actual column name, simple type name) for a column option, matched case-insensitively."""
    wanted = option_value(options, name)
    if wanted is None:
        return None
    for f in schema.fields:
        if f.name == wanted:
            return f.name, f.dataType.typeName()
    for f in schema.fields:
        if f.name.lower() == wanted.lower():
            return f.name, f.dataType.typeName()
    raise OptionError(name, f"no column {wanted!r} in the DataFrame (columns: {', '.join(schema.fieldNames())})")


@dataclass
class WriteOptions:
    brokers: list[str]
    topic: str
    group: str
    body_column: str | None = None
    body_format: str = "json"  # json | bytes | string
    key_column: str | None = None
    tags_column: str | None = None
    tags: str = ""
    batch_size: int = 1000
    max_batch_bytes: int = 1024 * 1024
    max_inflight: int = 4
    job_id: str | None = None
    commit: str = "auto"  # auto | deferred
    deadline_ms: int = 600_000
    prepared_deadline_ms: int = 0  # commit=deferred: how long the prepared job waits for its decision (0: 24 h)
    request_timeout: float = 30.0
    # how long a decision waits for SYNC slaves to hold it (a failover's heir waits for its old
    # master to rejoin as its slave), as Kafka's delivery.timeout.ms bounds a send
    decision_timeout: float = 120.0
    immunity_seconds: int | None = None
    stream_id: str | None = None
    checkpoint: str | None = None
    columns: list[str] = field(default_factory=list)
    security: BrokerSecurity = None  # credentials and TLS (security.py); its repr leaves out the secret
    faults: FaultPlan = field(default_factory=FaultPlan)  # inject.*: tests and demos only (faults.py)

    def __post_init__(self):
        if self.security is None:
            self.security = BrokerSecurity()


def _faults(options) -> FaultPlan:
    """The inject.* options (faults.py), checked in the order they were always checked."""
    fp = option_value(options, "inject.failPartition")
    fail_partition = _int(options, "inject.failPartition", 0, 0, 1_000_000) if fp is not None else None
    fail_mode = option_value(options, "inject.failMode", "crash").lower()
    if fail_mode not in FAIL_MODES:
        raise OptionError("inject.failMode", f"must be crash, raise or always, got {fail_mode!r}")
    sp = option_value(options, "inject.slowPartition")
    slow_partition = _int(options, "inject.slowPartition", 0, 0, 1_000_000) if sp is not None else None
    slow_seconds = _float(options, "inject.slowSeconds", 30.0, 0.0, 3600.0)
    hang_at = option_value(options, "inject.hangAt")
    if hang_at is not None and hang_at not in HANG_POINTS:
        raise OptionError("inject.hangAt", f"must be one of {', '.join(HANG_POINTS)}, got {hang_at!r}")
    hb = option_value(options, "inject.hangBatch")
    hang_batch = _int(options, "inject.hangBatch", 0, 0, 10**12) if hb is not None else None
    return FaultPlan(fail_partition, fail_mode, slow_partition, slow_seconds, hang_at, hang_batch,
                     option_value(options, "inject.markerFile"))


def parse_write_options(options, schema, *, streaming: bool) -> WriteOptions:
    brokers = parse_brokers(options)
    topic = parse_topic(options)
    group = option_value(options, "producerGroup")
    if group is None:
        raise OptionError("producerGroup", "is required: the producer group the write's job belongs to")
    if len(group) > 255 or any(c.isspace() for c in group):
        raise OptionError("producerGroup", f"must be at most 255 characters without spaces, got {group!r}")
    if option_value(options, "ledger") is not None:
        import logging

        logging.getLogger("txbroker_spark").warning(
            "txbroker option 'ledger' is no longer used and is ignored: the broker keeps each write's decision")
    o = WriteOptions(brokers=brokers, topic=topic, group=group, columns=schema.fieldNames(),
                     security=_security(options))

    body = _column(schema, options, "bodyColumn")
    fmt = (option_value(options, "bodyFormat", "auto")).lower()
    if fmt not in ("auto", "json", "bytes", "string"):
        raise OptionError("bodyFormat", f"must be auto, json, bytes or string, got {fmt!r}")
    if body is None:
        if fmt in ("bytes", "string"):
            raise OptionError("bodyColumn", f"is required with bodyFormat={fmt}")
        o.body_format = "json"
    else:
        o.body_column, kind = body
        if fmt == "auto":
            fmt = {"binary": "bytes", "string": "string"}.get(kind, "json")
        if fmt == "bytes" and kind != "binary":
            raise OptionError("bodyColumn", f"column {o.body_column!r} is {kind}, not binary (bodyFormat=bytes)")
        if fmt == "string" and kind != "string":
            raise OptionError("bodyColumn", f"column {o.body_column!r} is {kind}, not string (bodyFormat=string)")
        o.body_format = fmt
    key = _column(schema, options, "keyColumn")
    o.key_column = key[0] if key else None
    tags = _column(schema, options, "tagsColumn")
    o.tags_column = tags[0] if tags else None
    o.tags = option_value(options, "tags", "")
    if o.tags_column and o.tags:
        raise OptionError("tags", "give either tags (one value for every message) or tagsColumn, not both")

    o.batch_size = _int(options, "batchSize", 1000, 1, 100_000)
    o.max_batch_bytes = _int(options, "maxBatchBytes", 1024 * 1024, 1024, MAX_TOTAL_BODY)
    o.max_inflight = _int(options, "maxInflight", 4, 1, 256)
    o.deadline_ms = int(_float(options, "deadlineSeconds", 600.0, 1.0, 7 * 86400.0) * 1000)
    o.prepared_deadline_ms = int(_float(options, "preparedDeadlineSeconds", 0.0, 0.0, 7 * 86400.0) * 1000)
    if o.prepared_deadline_ms and o.prepared_deadline_ms < 1000:
        raise OptionError("preparedDeadlineSeconds", "must be at least 1 (or 0: the broker's 24 h)")
    o.request_timeout = _float(options, "requestTimeoutSeconds", 30.0, 0.5, 600.0)
    o.decision_timeout = _float(options, "decisionTimeoutSeconds", 120.0, 1.0, 3600.0)
    immunity = option_value(options, "checkImmunitySeconds")
    o.immunity_seconds = _int(options, "checkImmunitySeconds", 0, 1, 86400) if immunity else None
    o.commit = (option_value(options, "commit", "auto")).lower()
    if o.commit not in ("auto", "deferred"):
        raise OptionError("commit", f"must be auto or deferred, got {o.commit!r}")
    job = option_value(options, "jobId")
    if job is not None:
        if streaming:
            raise OptionError("jobId", "is for batch writes; a streaming query's identity is its checkpoint")
        # the broker job's name: an earlier run's open or prepared job of that name is aborted and replaced
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}", job):
            raise OptionError("jobId", f"must be 1-48 characters from letters, digits, '_', '.', '-', got {job!r}")
        o.job_id = job
    if streaming and o.commit != "auto":
        raise OptionError("commit", "deferred commit is for batch writes only")
    o.stream_id = option_value(options, "streamId")
    if o.stream_id is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}", o.stream_id):
        raise OptionError("streamId", f"must be 1-48 characters from letters, digits, '_', '.', '-', got {o.stream_id!r}")
    o.checkpoint = option_value(options, "checkpointLocation")

    o.faults = _faults(options)
    return o


@dataclass
class ReadOptions:
    brokers: list[str]
    topic: str
    queues: list[int] | None = None
    starting: dict[int, int] | None = None  # None: earliest
    ending: dict[int, int] | None = None  # None: latest (at planning time)
    pull_batch: int = 512
    request_timeout: float = 30.0
    security: BrokerSecurity = None

    def __post_init__(self):
        if self.security is None:
            self.security = BrokerSecurity()


def _offsets(options, name: str) -> dict[int, int] | None:
    import json

    raw = option_value(options, name)
    if raw is None or raw.lower() in ("earliest", "latest"):
        if raw is not None and raw.lower() == ("latest" if name == "startingOffsets" else "earliest"):
            raise OptionError(name, f"{raw!r} makes an empty range; give a JSON object {{\"queue\": offset}}")
        return None
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError
        out = {int(k): int(v) for k, v in doc.items()}
    except (ValueError, TypeError):
        raise OptionError(name, f"expected earliest/latest or a JSON object like {{\"0\": 10, \"1\": 0}}, got {raw!r}") \
            from None
    if any(v < 0 for v in out.values()):
        raise OptionError(name, "offsets must not be negative")
    return out


def parse_read_options(options) -> ReadOptions:
    o = ReadOptions(brokers=parse_brokers(options), topic=parse_topic(options), security=_security(options))
    q = option_value(options, "queues")
    if q is not None:
        try:
            o.queues = sorted({int(x) for x in q.split(",") if x.strip()})
        except ValueError:
            raise OptionError("queues", f"expected a comma-separated list of queue ids, got {q!r}") from None
    o.starting = _offsets(options, "startingOffsets")
    o.ending = _offsets(options, "endingOffsets")
    o.pull_batch = _int(options, "pullBatchSize", 512, 1, 1024)
    o.request_timeout = _float(options, "requestTimeoutSeconds", 30.0, 0.5, 600.0)
    return o
