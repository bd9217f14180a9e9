"""Broker configuration: a TOML file, overridden by command-line flags.

Names follow RocketMQ's broker.conf where it has one (flushDiskType, transactionCheckInterval,
transactionTimeOut, transactionCheckMax, rejectTransactionMessage, maxMessageSize), in snake_case.
"""

from __future__ import annotations

import re
import tomllib
from typing import Literal

import msgspec
from msgspec import Struct, field

from txbroker.protocol.admin import SettingsError, TransactionSettings
from txbroker.protocol.idle_poll import DEFAULT_WINDOW_US, MAX_WINDOW_US


class ConfigError(SettingsError):
    """The configuration is broken; the message names the setting."""


class BrokerConfig(Struct, forbid_unknown_fields=True):
    data_dir: str = ""
    broker_name: str = "broker-a"
    listen: str = "127.0.0.1:10911"
    admin_listen: str = "127.0.0.1:10912"
    role: Literal["master", "slave"] = "master"
    master: str = ""  # the master's data-plane address, for a slave
    group: str = ""  # the broker group this broker belongs to (protocol/cluster.py); "" outside any cluster
    cluster_file: str = ""  # the cluster route, watched for changes
    flush_disk_type: Literal["SYNC", "ASYNC"] = "ASYNC"
    # ASYNC flush: the log is fsynced this often (RocketMQ's flushIntervalCommitLog): a power loss
    # takes at most what was written since (a kill -9 takes nothing: the OS has it)
    flush_interval_ms: int = 500
    # SYNC: a write is answered once `sync_replicas` slaves have it (RocketMQ's SYNC_MASTER);
    # ASYNC: once the master has it (ASYNC_MASTER).
    replication_mode: Literal["SYNC", "ASYNC"] = "ASYNC"
    sync_replicas: int = 1
    replication_timeout_ms: int = 3_000  # then FLUSH_SLAVE_TIMEOUT
    # An idle replication link carries a heartbeat this often; a link silent for
    # SILENT_HEARTBEATS of them (a paused or cut-off peer sends no FIN) is dropped by either side.
    replication_heartbeat_ms: int = 1_000
    slave_read_enable: bool = False  # a slave serves pulls of replicated messages
    # Told to stop (SIGTERM) as a master with a slave in sync: keep serving up to this long while the
    # operator hands mastership over (a switchover: a drain evicting the master's pod), then stop. 0: stop at once.
    stop_handover_wait_ms: int = 0
    # Under a controller (the operator): a master that starts again on a store it led takes no write
    # until the controller confirms it still is the master (POST /api/v1/role at its own epoch). Its
    # pod's role may have been read before a promotion it missed while it was down.
    await_role_confirmation: bool = False
    # Retention (store/retention.py): records older than retention_ms go (RocketMQ's fileReservedTime,
    # 72 h), and the oldest go while the log holds more than retention_bytes (0: no size limit);
    # checked every retention_check_interval_ms.
    retention_ms: int = 72 * 3_600_000
    retention_bytes: int = 0
    retention_check_interval_ms: int = 60_000
    # A decided job (coordinated transaction) is kept this long after its decision, and at least
    # until its decision left the log: a replay by its name within it finds it (Kafka's
    # transactional.id.expiration.ms, 7 days).
    job_retention_ms: int = 7 * 24 * 3_600_000
    # Every record of the store read back (checksums checked) soon after the start, then this often;
    # a damaged file stops the broker (a slave is seeded from its master). 0: never.
    scrub_interval_ms: int = 24 * 3_600_000
    auto_create_topic: bool = True
    default_queue_count: int = 4
    max_message_size: int = 4 * 1024 * 1024
    reject_transaction_message: bool = False
    max_inflight_per_connection: int = 1024
    # After its last read or write the event loop polls this long before it sleeps in epoll (giving
    # the CPU to any other process that wants it): a request arriving meanwhile is not delayed by a
    # wake-up (protocol/idle_poll.py; Seastar's idle-poll-time-us). 0: sleep at once, for hosts
    # whose CPUs are shared too thinly to spend any polling.
    idle_poll_us: int = DEFAULT_WINDOW_US
    # Limits (broker/limits.py).
    max_connections: int = 4096
    max_unacked_bytes: int = 256 * 1024 * 1024  # request bytes held unanswered, all connections together
    idle_timeout_ms: int = 600_000  # close connections idle this long; 0: never
    auth_timeout_ms: int = 10_000  # with auth on: time a new connection has to authenticate
    # Security (broker/auth/, broker/tls.py). Off unless given.
    auth_file: str = ""  # credentials and ACL (TOML); reloaded on change and on SIGHUP
    auth_reload_interval_ms: int = 1_000  # how often the credentials and TLS files are checked for changes
    tls_cert: str = ""  # PEM certificate chain, both planes
    tls_key: str = ""
    tls_client_ca: str = ""  # given: client certificates required (data plane; admin plane under /api/)
    tls_ca: str = ""  # a slave verifies its master with this CA; given, replication uses TLS
    # the name a slave checks its master's certificate against (default: the host in `master`); on
    # Kubernetes masters are addressed by pod IP, so the operator passes the headless Service's name
    tls_server_name: str = ""
    replication_access_key: str = ""  # a slave's credentials towards a master that requires authentication
    replication_secret_file: str = ""  # file holding that access key's secret
    producer_expiry_ms: int = 120_000  # a producer silent this long gets no more check-backs
    consumer_expiry_ms: int = 120_000  # a consumer silent this long leaves its group
    # Delays of the retry levels; a failed message's first retry waits level 3 (RocketMQ's levels).
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    log_level: str = "INFO"
    transaction: TransactionSettings = field(default_factory=TransactionSettings)

    @property
    def max_frame_size(self) -> int:
        return self.max_message_size + 64 * 1024  # room for headers and properties

    def validate(self) -> "BrokerConfig":
        if not self.data_dir:
            raise ConfigError("data_dir is required (--data-dir or data_dir in the config file)")
        for name in ("listen", "admin_listen"):
            parse_address(getattr(self, name), name)
        if self.role == "slave" and self.master:
            parse_address(self.master, "master")
        if not 1 <= self.default_queue_count <= 1024:
            raise ConfigError(f"default_queue_count must be between 1 and 1024, got {self.default_queue_count}")
        if not 1024 <= self.max_message_size <= 64 * 1024 * 1024:
            raise ConfigError(f"max_message_size must be between 1 KiB and 64 MiB, got {self.max_message_size}")
        if not 1 <= self.sync_replicas <= 8:
            raise ConfigError(f"sync_replicas must be between 1 and 8, got {self.sync_replicas}")
        if self.retention_ms < 1:
            raise ConfigError(f"retention_ms must be at least 1, got {self.retention_ms}")
        if self.retention_bytes < 0:
            raise ConfigError(f"retention_bytes must be 0 (no size limit) or more, got {self.retention_bytes}")
        if not 10 <= self.flush_interval_ms <= 60_000:
            raise ConfigError(f"flush_interval_ms must be between 10 and 60000, got {self.flush_interval_ms}")
        if self.scrub_interval_ms < 0:
            raise ConfigError(f"scrub_interval_ms must be 0 (never) or more, got {self.scrub_interval_ms}")
        if self.job_retention_ms < 1:
            raise ConfigError(f"job_retention_ms must be at least 1, got {self.job_retention_ms}")
        if self.retention_check_interval_ms < 10:
            raise ConfigError(f"retention_check_interval_ms must be at least 10, got {self.retention_check_interval_ms}")
        if self.replication_heartbeat_ms < 10:
            raise ConfigError(f"replication_heartbeat_ms must be at least 10, got {self.replication_heartbeat_ms}")
        if not 0 <= self.stop_handover_wait_ms <= 600_000:
            raise ConfigError(f"stop_handover_wait_ms must be between 0 and 600000, got {self.stop_handover_wait_ms}")
        if self.replication_timeout_ms < 10:
            raise ConfigError(f"replication_timeout_ms must be at least 10, got {self.replication_timeout_ms}")
        self._validate_cluster()
        self._validate_security()
        try:
            parse_delay_levels(self.message_delay_level)
        except ValueError as e:
            raise ConfigError(f"message_delay_level: {e}") from None
        try:
            self.transaction.validate()
        except SettingsError as e:
            raise ConfigError(str(e)) from None
        return self


    def _validate_cluster(self) -> None:
        from txbroker.protocol.cluster import RouteError, check_group_name, load_route_file

        if bool(self.group) != bool(self.cluster_file):
            raise ConfigError("group and cluster_file go together: a broker of a cluster names its group "
                              "(--group) and the route that lists it (--cluster-file)")
        if not self.group:
            return
        try:
            check_group_name(self.group, "group")
            route = load_route_file(self.cluster_file)
        except RouteError as e:
            raise ConfigError(str(e)) from None
        if route.group(self.group) is None:
            raise ConfigError(f"group {self.group!r} is not in cluster file {self.cluster_file} "
                              f"(it lists {', '.join(route.names)})")

    def _validate_security(self) -> None:
        if not 1 <= self.max_connections <= 1_000_000:
            raise ConfigError(f"max_connections must be between 1 and 1000000, got {self.max_connections}")
        if self.max_unacked_bytes < self.max_frame_size:
            raise ConfigError(f"max_unacked_bytes ({self.max_unacked_bytes}) must hold at least one frame "
                              f"(max_message_size + 64 KiB = {self.max_frame_size})")
        if not 1 <= self.max_inflight_per_connection <= 1_000_000:
            raise ConfigError(f"max_inflight_per_connection must be between 1 and 1000000, "
                              f"got {self.max_inflight_per_connection}")
        if not 0 <= self.idle_poll_us <= MAX_WINDOW_US:
            raise ConfigError(f"idle_poll_us must be between 0 (off) and {MAX_WINDOW_US}, got {self.idle_poll_us}")
        if self.idle_timeout_ms < 0 or 0 < self.idle_timeout_ms < 100:
            raise ConfigError(f"idle_timeout_ms must be 0 (never) or at least 100, got {self.idle_timeout_ms}")
        if self.auth_timeout_ms < 100:
            raise ConfigError(f"auth_timeout_ms must be at least 100, got {self.auth_timeout_ms}")
        if self.auth_reload_interval_ms < 50:
            raise ConfigError(f"auth_reload_interval_ms must be at least 50, got {self.auth_reload_interval_ms}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together: give both (--tls-cert, --tls-key) or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca needs tls_cert and tls_key: client certificates are checked over TLS")
        if bool(self.replication_access_key) != bool(self.replication_secret_file):
            raise ConfigError("replication_access_key and replication_secret_file go together")

    def replication_secret(self) -> str:
        """The slave's secret, read from replication_secret_file (trailing newline dropped)."""
        try:
            with open(self.replication_secret_file) as f:
                secret = f.read().rstrip("\r\n")
        except OSError as e:
            raise ConfigError(f"cannot read replication_secret_file {self.replication_secret_file}: "
                              f"{e.strerror or e}") from None
        if not secret:
            raise ConfigError(f"replication_secret_file {self.replication_secret_file} is empty")
        return secret


def parse_address(text: str, name: str = "address") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name} must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> list[int]:
    """'1s 5s 10s 30s 1m ...' -> milliseconds per level (level 1 first)."""
    out = []
    for part in text.split():
        m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", part)
        if not m:
            raise ValueError(f"delay level {part!r}: use a number and a unit (ms, s, m, h, d), e.g. 10s")
        out.append(int(m.group(1)) * _UNITS[m.group(2)])
    if not out:
        raise ValueError("at least one delay level is needed")
    return out


_FLUSH_ALIASES = {"SYNC_FLUSH": "SYNC", "ASYNC_FLUSH": "ASYNC", "SYNC_MASTER": "SYNC", "ASYNC_MASTER": "ASYNC"}


def load_config(path: str | None, overrides: dict) -> BrokerConfig:
    """Read the TOML file at `path` (if any), apply non-None `overrides`, and validate."""
    raw: dict = {}
    if path:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    for key, value in overrides.items():
        if value is not None:
            raw[key] = value
    for key in ("flush_disk_type", "replication_mode"):
        if key in raw:
            raw[key] = _FLUSH_ALIASES.get(str(raw[key]).upper(), str(raw[key]).upper())
    try:
        cfg = msgspec.convert(raw, BrokerConfig)
    except msgspec.ValidationError as e:
        where = f" in {path}" if path else ""
        raise ConfigError(f"invalid broker configuration{where}: {e}") from None
    return cfg.validate()
