"""`txbroker broker`: run a broker process."""

from __future__ import annotations

import argparse
import os
import sys

from txbroker.broker.config import load_config
from txbroker.protocol.admin import SettingsError


def register(sub) -> None:
    p = sub.add_parser(
        "broker", help="run a broker",
        description="Run a broker. Settings come from --config (TOML, keys as in BrokerConfig: data_dir, listen, "
                    "admin_listen, role, flush_disk_type, [transaction] check_interval_ms ...); flags override it. "
                    "Stops cleanly on SIGTERM; SIGHUP reloads the credentials and TLS files.",
    )
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument("--data-dir", help="RocksDB data directory (created if missing)")
    p.add_argument("--listen", help="data-plane address HOST:PORT (default 127.0.0.1:10911)")
    p.add_argument("--admin-listen", help="admin/metrics HTTP address HOST:PORT (default 127.0.0.1:10912)")
    p.add_argument("--role", choices=["master", "slave"], help="master (default) or slave")
    p.add_argument("--master", help="the master's data-plane address, for a slave")
    p.add_argument("--broker-name", help="name shown in logs, metrics and answers")
    clu = p.add_argument_group("broker groups (one cluster of several masters; see docs/broker-groups.md)")
    clu.add_argument("--group", help="the broker group (a master and its slaves) this broker belongs to, as the "
                                     "cluster file names it")
    clu.add_argument("--cluster-file",
                     help="the cluster route (YAML: cluster, version, groups with name, addresses, state); "
                          "served to clients that bootstrap here, reloaded when the file changes")
    p.add_argument("--flush-disk-type", choices=["SYNC", "ASYNC", "SYNC_FLUSH", "ASYNC_FLUSH"],
                   help="SYNC: acknowledge after fsync (group commit); ASYNC (default): after the write")
    p.add_argument("--flush-interval-ms", type=int,
                   help="ASYNC flush: fsync the log this often; a power loss takes at most what was written since "
                        "(default 500, RocketMQ's flushIntervalCommitLog)")
    p.add_argument("--idle-poll-us", type=int,
                   help="after its last read or write the event loop polls this many microseconds before it "
                        "sleeps, yielding the CPU to any process that wants it: the next request is not delayed "
                        "by a wake-up (default 200; 0: sleep at once, for thinly shared CPUs). A client "
                        "process polls for a lone request's answer for TXBROKER_IDLE_POLL_US (default 200; 0: off)")
    p.add_argument("--replication-mode", choices=["SYNC", "ASYNC"],
                   help="SYNC: answer writes once --sync-replicas slaves have them; ASYNC (default): once the master has")
    p.add_argument("--sync-replicas", type=int, help="slaves that must acknowledge a SYNC write (default 1)")
    p.add_argument("--replication-timeout-ms", type=int,
                   help="wait this long for slave acknowledgements, then answer FLUSH_SLAVE_TIMEOUT (default 3000)")
    p.add_argument("--replication-heartbeat-ms", type=int,
                   help="the master sends a heartbeat on an idle replication link this often; either side drops "
                        "a link silent for 5 heartbeats, e.g. a paused or cut-off peer (default 1000)")
    p.add_argument("--retention-ms", type=int,
                   help="delete log records older than this; pending transactions' half messages stay "
                        "(default 259200000, 72 h, RocketMQ's fileReservedTime)")
    p.add_argument("--retention-bytes", type=int,
                   help="also delete the oldest records while the log holds more than this (default 0: no limit)")
    p.add_argument("--retention-check-interval-ms", type=int,
                   help="how often retention runs, and the resolution of its cutoff (default 60000)")
    p.add_argument("--job-retention-ms", type=int,
                   help="keep a decided job this long after its decision (and until its decision left the log): "
                        "a replay by its name within it finds it, later one opens a new job "
                        "(default 604800000, 7 days, as Kafka's transactional.id.expiration.ms)")
    p.add_argument("--scrub-interval-ms", type=int,
                   help="read every record of the store back (checksums checked) soon after the start and then "
                        "this often; a damaged file stops the broker, and a slave is seeded from its master "
                        "(default 86400000, a day; 0: never)")
    p.add_argument("--reseed", action="store_true",
                   help="a slave: replace this data directory's store with a copy of its master's before starting "
                        "(the previous one is kept in DATA_DIR/.damaged). A slave does this by itself when its store "
                        "is damaged or its master deleted records it needs")
    p.add_argument("--stop-handover-wait-ms", type=int,
                   default=int(os.environ["TXBROKER_STOP_HANDOVER_WAIT_MS"])
                   if os.environ.get("TXBROKER_STOP_HANDOVER_WAIT_MS", "").isdigit() else None,
                   help="told to stop (SIGTERM) as a master with a slave in sync, keep serving up to this long "
                        "while mastership is handed over (POST /api/v1/handover, the operator's switchover when "
                        "a drain evicts the master's pod), then stop (default: env TXBROKER_STOP_HANDOVER_WAIT_MS, "
                        "else 0: stop at once)")
    p.add_argument("--await-role-confirmation", action="store_true",
                   default=True if os.environ.get("TXBROKER_AWAIT_ROLE_CONFIRMATION") == "1" else None,
                   help="under a controller (the operator sets it): a master that starts again on a store it led "
                        "takes no write until the controller confirms it still is the master (POST /api/v1/role "
                        "with its own epoch), since its role may have been read before a promotion it missed "
                        "while it was down (default: env TXBROKER_AWAIT_ROLE_CONFIRMATION=1, else off)")
    p.add_argument("--slave-read-enable", action="store_true", default=None,
                   help="as a slave, serve pulls of replicated messages")
    p.add_argument("--message-delay-level",
                   help="retry delays per level, e.g. '1s 5s 10s 30s 1m ...' (RocketMQ's 18 levels by default)")
    p.add_argument("--consumer-expiry-ms", type=int, help="a consumer silent this long leaves its group (default 120000)")
    p.add_argument("--check-interval-ms", type=int, help="transaction check-back interval (default 60000)")
    p.add_argument("--transaction-timeout-ms", type=int, help="age before a half message is checked (default 6000)")
    p.add_argument("--check-max", type=int, help="checks before a transaction is parked (default 15)")
    p.add_argument("--max-message-size", type=int, help="largest message body in bytes (default 4 MiB)")
    p.add_argument("--reject-transaction-message", action="store_true", default=None,
                   help="refuse half messages with NO_PERMISSION")
    p.add_argument("--no-auto-create-topic", dest="auto_create_topic", action="store_false", default=None,
                   help="refuse sends to topics not created first")
    p.add_argument("--log-level", help="DEBUG, INFO (default), WARNING")
    sec = p.add_argument_group("security (off unless given; see README, Security)")
    sec.add_argument("--auth-file", help="credentials and ACL file (TOML, hashed secrets); requires every client "
                                         "to authenticate. Reloaded on change and on SIGHUP")
    sec.add_argument("--tls-cert", help="PEM certificate chain: both planes accept TLS only")
    sec.add_argument("--tls-key", help="PEM private key of --tls-cert")
    sec.add_argument("--tls-client-ca", help="CA bundle for client certificates: given, clients must present one")
    sec.add_argument("--tls-ca", help="CA bundle a slave verifies its master with; given, replication uses TLS")
    sec.add_argument("--tls-server-name", help="name a slave checks its master's certificate against "
                                               "(default: the host in --master)")
    sec.add_argument("--replication-access-key", help="a slave's access key towards a master that requires auth")
    sec.add_argument("--replication-secret-file", help="file holding the secret of --replication-access-key")
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-connections", type=int, help="data-plane connections at once (default 4096)")
    lim.add_argument("--max-unacked-bytes", type=int,
                     help="request bytes held unanswered across connections before SYSTEM_BUSY (default 256 MiB)")
    lim.add_argument("--max-inflight-per-connection", type=int,
                     help="requests in flight per connection before the broker stops reading it (default 1024)")
    lim.add_argument("--idle-timeout-ms", type=int, help="close connections idle this long; 0 never (default 600000)")
    lim.add_argument("--auth-timeout-ms", type=int, help="time a connection has to authenticate (default 10000)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    overrides = {
        "data_dir": args.data_dir, "listen": args.listen, "admin_listen": args.admin_listen, "role": args.role,
        "master": args.master, "broker_name": args.broker_name, "group": args.group, "cluster_file": args.cluster_file, "flush_disk_type": args.flush_disk_type,
        "flush_interval_ms": args.flush_interval_ms, "idle_poll_us": args.idle_poll_us,
        "max_message_size": args.max_message_size, "reject_transaction_message": args.reject_transaction_message,
        "auto_create_topic": args.auto_create_topic, "log_level": args.log_level,
        "replication_mode": args.replication_mode, "sync_replicas": args.sync_replicas,
        "replication_timeout_ms": args.replication_timeout_ms,
        "replication_heartbeat_ms": args.replication_heartbeat_ms, "retention_ms": args.retention_ms,
        "retention_bytes": args.retention_bytes, "retention_check_interval_ms": args.retention_check_interval_ms,
        "job_retention_ms": args.job_retention_ms, "scrub_interval_ms": args.scrub_interval_ms,
        "slave_read_enable": args.slave_read_enable, "stop_handover_wait_ms": args.stop_handover_wait_ms,
        "await_role_confirmation": args.await_role_confirmation,
        "message_delay_level": args.message_delay_level, "consumer_expiry_ms": args.consumer_expiry_ms,
        "auth_file": args.auth_file, "tls_cert": args.tls_cert, "tls_key": args.tls_key,
        "tls_client_ca": args.tls_client_ca, "tls_ca": args.tls_ca, "tls_server_name": args.tls_server_name,
        "replication_access_key": args.replication_access_key,
        "replication_secret_file": args.replication_secret_file, "max_connections": args.max_connections,
        "max_unacked_bytes": args.max_unacked_bytes, "max_inflight_per_connection": args.max_inflight_per_connection,
        "idle_timeout_ms": args.idle_timeout_ms, "auth_timeout_ms": args.auth_timeout_ms,
    }
    tx = {"check_interval_ms": args.check_interval_ms, "timeout_ms": args.transaction_timeout_ms,
          "check_max": args.check_max}
    try:
        cfg = load_config(args.config, overrides)
        if any(v is not None for v in tx.values()):
            cfg.transaction = cfg.transaction.merged({k: v for k, v in tx.items() if v is not None}, "transaction")
    except SettingsError as e:  # a ConfigError, or flags' transaction settings
        print(f"txbroker broker: {e}", file=sys.stderr)
        return 2
    if args.reseed:
        if cfg.role != "slave" or not cfg.master:
            print("txbroker broker: --reseed seeds a slave from its master: give --role slave --master ADDRESS",
                  file=sys.stderr)
            return 2
        from txbroker.store import seed
        seed.mark(cfg.data_dir, "asked for (--reseed)")
    from txbroker.broker.main import run as run_broker
    return run_broker(cfg)
