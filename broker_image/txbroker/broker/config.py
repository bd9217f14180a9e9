"""Broker configuration: a TOML file, overridden by command-line flags.

Names follow RocketMQ's broker.conf where it has one (flushDiskType, transactionCheckInterval,
transactionTimeOut, transactionCheckMax, rejectTransactionMessage, maxMessageSize), in snake_case.
"""

from __future__ import annotations

import tomllib
from typing import Literal

import msgspec
from msgspec import Struct, field


class ConfigError(ValueError):
    """The configuration is broken; the message names the setting."""


class TransactionSettings(Struct, forbid_unknown_fields=True):
    check_interval_ms: int = 60_000  # RocketMQ's transactionCheckInterval (the seeds' 60 s)
    timeout_ms: int = 6_000  # transactionTimeOut: a half message younger than this is not checked
    check_max: int = 15  # transactionCheckMax: checks before parking in TRANS_CHECK_MAX_TIME_TOPIC
    # CHECK_IMMUNITY_TIME for messages that carry none (0: timeout_ms); waiting it out burns no check
    default_immunity_ms: int = 0
    # check-back through an HTTP webhook instead of a producer connection (TxProducerGroup checkMode http)
    webhook_url: str = ""

    def validate(self, where: str = "transaction") -> "TransactionSettings":
        if self.default_immunity_ms < 0:
            raise ConfigError(f"{where}.default_immunity_ms must not be negative, got {self.default_immunity_ms}")
        if self.webhook_url and not self.webhook_url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.webhook_url must be an http:// or https:// URL, got {self.webhook_url!r}")
        if self.check_interval_ms < 100:
            raise ConfigError(f"{where}.check_interval_ms must be at least 100, got {self.check_interval_ms}")
        if self.timeout_ms < 0:
            raise ConfigError(f"{where}.timeout_ms must not be negative, got {self.timeout_ms}")
        if not 1 <= self.check_max <= 10_000:
            raise ConfigError(f"{where}.check_max must be between 1 and 10000, got {self.check_max}")
        return self


class BrokerConfig(Struct, forbid_unknown_fields=True):
    data_dir: str = ""
    broker_name: str = "broker-a"
    listen: str = "127.0.0.1:10911"
    admin_listen: str = "127.0.0.1:10912"
    role: Literal["master", "slave"] = "master"
    master: str = ""  # the master's data-plane address, for a slave
    flush_disk_type: Literal["SYNC", "ASYNC"] = "ASYNC"
    # SYNC: a write is answered once `sync_replicas` slaves have it (RocketMQ's SYNC_MASTER);
    # ASYNC: once the master has it (ASYNC_MASTER).
    replication_mode: Literal["SYNC", "ASYNC"] = "ASYNC"
    sync_replicas: int = 1
    replication_timeout_ms: int = 3_000  # then FLUSH_SLAVE_TIMEOUT
    slave_read_enable: bool = False  # a slave serves pulls of replicated messages
    auto_create_topic: bool = True
    default_queue_count: int = 4
    max_message_size: int = 4 * 1024 * 1024
    reject_transaction_message: bool = False
    max_inflight_per_connection: int = 1024
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
        if self.replication_timeout_ms < 10:
            raise ConfigError(f"replication_timeout_ms must be at least 10, got {self.replication_timeout_ms}")
        from txbroker.broker.schedule_service import parse_delay_levels
        try:
            parse_delay_levels(self.message_delay_level)
        except ValueError as e:
            raise ConfigError(f"message_delay_level: {e}") from None
        self.transaction.validate()
        return self


def parse_address(text: str, name: str = "address") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name} must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


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
