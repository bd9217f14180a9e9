"""The broker: wires storage, transactions, check-back, the data plane and the admin plane."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from txbroker.broker import processors
from txbroker.broker.admin import AdminApp
from txbroker.broker.auth import AuthService
from txbroker.broker.transaction.check_service import CheckService
from txbroker.broker.cluster import ClusterMembership
from txbroker.broker.transaction.home import HomeDecisions
from txbroker.broker.transaction.participants import Participants
from txbroker.broker.config import BrokerConfig, parse_address, parse_delay_levels
from txbroker.broker.connection import BrokerConnection
from txbroker.broker.consumers import ConsumerRegistry
from txbroker.broker.failover import RoleChanges
from txbroker.broker.file_watch import FileWatcher
from txbroker.broker.transaction.job_groups import JobGroups
from txbroker.broker.transaction.jobs import JobService
from txbroker.broker.limits import UnackedBudget
from txbroker.broker.listener import TlsOnlyListener, admin_tls_listener, data_tls_listener
from txbroker.broker.metrics import BrokerMetrics
from txbroker.broker.state_metrics import StateCollector
from txbroker.broker.producers import ProducerRegistry
from txbroker.broker.replication.follower import ReplicationFollower
from txbroker.broker.replication.leader import ReplicationLeader
from txbroker.broker.replication.seed import SnapshotService
from txbroker.broker.backup import BackupService
from txbroker.broker.retention_service import RetentionService
from txbroker.broker.scrub_service import ScrubService
from txbroker.broker.wal_sync_service import WalSyncService
from txbroker.broker.role import RoleState
from txbroker.broker.schedule_service import ScheduleService
from txbroker.broker.transaction.settings import SettingsBook
from txbroker.protocol import idle_poll
from txbroker.protocol.admin import Replication
from txbroker.protocol.idle_poll import IdlePoll
from txbroker.broker.tls import BrokerTls, TlsError
from txbroker.broker.topics import TopicRegistry
from txbroker.broker.transaction.service import TransactionService, now_ms
from txbroker.store.db import is_corruption
from txbroker.store.reads import MessageReader
from txbroker.store.records import EpochRecord
from txbroker.store.seed import mark as reseed
from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)

EXIT_STORE_FAILED = 70
EXIT_STORE_DAMAGED = 71  # restart: a slave seeds itself from its master
EXIT_RESEED = 72  # restart: it seeds itself from its master


class Broker:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.metrics = BrokerMetrics()
        # Security first: a broken credentials or certificate file stops the start, before the store opens.
        self.auth = AuthService(config.auth_file, self.metrics) if config.auth_file else None
        self.tls = BrokerTls(config)
        self.replication_credentials = ((config.replication_access_key, config.replication_secret())
                                        if config.replication_access_key else None)
        self.unacked = UnackedBudget(config.max_unacked_bytes, self.metrics.unacked_bytes)
        self.cluster = ClusterMembership(config.group, config.cluster_file, self.replication_credentials,
                                         self._peer_tls(config))
        self._watcher = FileWatcher(([config.auth_file] if config.auth_file else []) + self.tls.files
                                    + self.cluster.files, self._files_changed, config.auth_reload_interval_ms / 1000)
        self.state = StateMachine(config.data_dir, config.flush_disk_type == "SYNC", self._fatal,
                                  self.metrics.observe_flush, config.job_retention_ms)
        self.state.on_corruption.append(self.corrupted)
        self.reader = MessageReader(self.state)
        self.role = RoleState(config.role, lambda: self.state.epoch, config.master)
        levels = parse_delay_levels(config.message_delay_level)
        self.topics = TopicRegistry(self.state, config.auto_create_topic, config.default_queue_count,
                                    config.max_message_size, len(levels),
                                    self.metrics.limit_refusals.labels("max_message_size").inc)
        self.settings = SettingsBook(config.transaction, self.state)
        self.producers = ProducerRegistry(config.producer_expiry_ms)
        self.consumers = ConsumerRegistry(config.consumer_expiry_ms)
        self.schedule = ScheduleService(self, levels)
        self.retention = RetentionService(self)
        self.scrub = ScrubService(self)
        self.wal_sync = WalSyncService(self)
        self._housekeeping: asyncio.Task | None = None
        self._handover_wait: asyncio.Future | None = None  # stopping: a master waiting to hand over first
        self.transactions = TransactionService(self.state, self.topics, self.role, self.metrics, self.settings,
                                               config.reject_transaction_message, self.cluster)
        self.participants = Participants(self.state, self.transactions, self.cluster, self.settings, self.role)
        self.transactions.participant_end = self.participants.end
        self.home_decisions = HomeDecisions(self.state, self.cluster, self.settings, self.role)
        self.jobs = JobService(self.state, self.transactions, self.role, self.metrics, self.cluster)
        self.job_groups = self.jobs.groups = JobGroups(self.state, self.jobs, self.transactions, self.cluster,
                                                       self.settings, self.role,
                                                       self.metrics.job_groups_visible.observe)
        self.check_service = CheckService(self.state, self.reader, self.transactions, self.settings,
                                          self.producers, self.metrics)
        self.leader = ReplicationLeader(self)
        self.snapshots = SnapshotService(self)
        self.backups = BackupService(self)
        self.roles = RoleChanges(self)
        self.follower: ReplicationFollower | None = None
        self.metrics.registry.register(StateCollector(self))  # read at scrape time only
        self.handlers = processors.handlers(self)
        self.connections: set[BrokerConnection] = set()
        self.idle_poll: IdlePoll | None = None  # set at start: the loop's poll before it sleeps (idle_poll_us)
        self.ready = False
        self.exit_code = 0
        self.stopped = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._listener: TlsOnlyListener | None = None
        self._admin_listener: TlsOnlyListener | None = None
        self._admin_runner: web.AppRunner | None = None

    async def start(self) -> None:
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        self.idle_poll = idle_poll.for_loop(loop, self.config.idle_poll_us)  # before any connection opens
        restarted = self.role.is_master and self.state.epoch != 0
        if restarted:  # its hold in force before any port answers (seed 509)
            await self._lead()
        host, port = parse_address(self.config.listen, "listen")
        if self.tls.data is None:
            self._server = await loop.create_server(lambda: BrokerConnection(self), host, port, reuse_address=True)
        else:
            self._listener = data_tls_listener(host, port, lambda: BrokerConnection(self), self.tls.data, self.metrics)
        ahost, aport = parse_address(self.config.admin_listen, "admin_listen")
        self._admin_runner = web.AppRunner(AdminApp(self).app, access_log=None)
        await self._admin_runner.setup()
        if self.tls.admin is None:
            await web.TCPSite(self._admin_runner, ahost, aport, reuse_address=True).start()
        else:
            self._admin_listener = admin_tls_listener(ahost, aport, self._admin_runner.server, self.tls.admin,
                                                      self.metrics)
        self._watcher.start()
        if self.role.is_master:
            if not restarted:  # a new master: epoch 1 once its ports are bound (a failed first start leaves a new store)
                await self._lead()
            if not self.role.on_hold:
                self.roles.start_master_services()
        elif self.config.master:
            self.follower = ReplicationFollower(self, self.config.master)
            self.follower.start()
        self._housekeeping = loop.create_task(self._housekeep())
        self.retention.start()
        self.scrub.start()
        self.wal_sync.start()
        self.ready = True
        pending, parked = self.transactions.counts()
        log.info("broker %s started as %s at epoch %d in %.3fs (store recovered in %.3fs): data %s, admin %s, "
                 "flush %s, %d pending and %d parked transactions; %s",
                 self.config.broker_name, self.role.role, self.role.epoch,
                 time.perf_counter() - t0 + self.state.recovery_seconds,
                 self.state.recovery_seconds, self.data_address, self.admin_address, self.config.flush_disk_type,
                 pending, parked, self.security_summary())
        if self.auth is not None and self.tls.admin is None:
            log.warning("authentication is on but the admin API is plain HTTP: HTTP Basic credentials cross the "
                        "network in clear text; give --tls-cert/--tls-key outside a trusted network")

    async def _lead(self) -> None:
        """A master's role, and whether it holds writes. A restarted master settles them before any
        port answers: a slave subscribing (or a controller confirming) in the moment after the data
        port opened found no probation to end, and the hold begun after it lasted for good (the fault
        harness, seed 509). Until it leads, a master refuses writes (role.require_master)."""
        restarted = self.state.epoch != 0
        if not restarted:  # a new master opens epoch 1
            await self.state.append(EpochRecord(1, self.config.broker_name, now_ms()))[1]
        self.leader.attach()
        if restarted and self.config.await_role_confirmation:
            self.roles.await_confirmation()
        if restarted and self.config.replication_mode == "SYNC":
            # ASYNC flush: a power cut may have taken records its slaves have; SYNC flush too, a
            # damaged write-ahead log cut short (seed 450): either way, not before a slave shows it
            self.roles.begin_probation()

    @staticmethod
    def _peer_tls(config: BrokerConfig):
        """Other groups' masters are asked as a slave asks its master: replication's TLS settings."""
        if not config.tls_ca:
            return None
        from txbroker.client.security import TlsConfig

        return TlsConfig(config.tls_ca, config.tls_cert or None, config.tls_key or None,
                         config.tls_server_name or None)

    @property
    def data_address(self) -> str:
        if self._listener is not None:
            sock = self._listener.address
        else:
            sock = self._server.sockets[0].getsockname() if self._server else ("?", 0)
        return f"{sock[0]}:{sock[1]}"

    @property
    def admin_address(self) -> str:
        if self._admin_listener is not None:
            a = self._admin_listener.address
        elif self._admin_runner is None or not self._admin_runner.addresses:
            return "?"
        else:
            a = self._admin_runner.addresses[0]
        return f"{a[0]}:{a[1]}"

    def security_summary(self) -> str:
        c = self.config
        auth = f"auth from {c.auth_file} ({len(self.auth.principals)} users)" if self.auth else "auth off"
        tls = ("TLS" + (" with client certificates" if c.tls_client_ca else "")) if self.tls.data else "plaintext"
        return f"{auth}, {tls}"

    # ---- security: reloads ---------------------------------------------------------------------

    def _files_changed(self) -> None:
        self.reload_security()
        self.cluster.reload()

    def reload_security(self) -> None:
        """Re-read the credentials and TLS files (on change, and on SIGHUP). A broken file is
        reported and the previous state kept."""
        if self.auth is not None and self.auth.reload():
            self._revalidate_connections()
        if self.tls.files:
            try:
                self.tls.reload()
            except TlsError as e:
                log.error("TLS files not reloaded, keeping the certificates in force: %s", e)

    def _revalidate_connections(self) -> None:
        """After a reload: connections whose credentials went away get no more check-backs or
        notifications (their next request is refused); those whose permissions changed are
        unregistered so that their next heartbeat registers only what is still allowed."""
        for conn in list(self.connections):
            p = conn.principal
            if p is None:
                continue
            current = self.auth.lookup(p.access_key)
            if current is p:
                continue
            self.producers.remove(conn)
            self.consumers.remove_connection(conn)
            if self.auth.valid(p):
                conn.authenticated(current)
            else:
                log.warning("connection from %s: credentials of %s revoked or changed", conn.peer, p.access_key)

    async def stop_after_handover(self) -> None:
        """Stop; a master with a slave in sync first serves on for up to stop_handover_wait_ms while
        mastership is handed over (its pod is being deleted: the operator switches over), so a
        planned stop is a switchover, not a failover. A second SIGTERM stops at once."""
        wait = self.config.stop_handover_wait_ms / 1000
        if self._handover_wait is not None:   # a second SIGTERM: the first one's wait ends, and it stops
            self._handover_wait.cancel()
            return
        if not wait or not self.role.is_master or not self.leader.in_sync():
            await self.stop()
            return
        log.warning("told to stop as master with %d slave(s) in sync: serving on for up to %.0fs while mastership is "
                    "handed over (a switchover)", self.leader.in_sync(), wait)
        self._handover_wait = asyncio.ensure_future(self.roles.not_master())
        try:
            await asyncio.wait_for(self._handover_wait, wait)
            log.info("handed over: stopping")
        except (asyncio.TimeoutError, asyncio.CancelledError):
            log.warning("stopping%s", " with no handover within %.0fs" % wait if self.role.is_master else "")
        await self.stop()

    async def stop(self) -> None:
        if not self.ready and self._server is None:
            return
        self.ready = False
        log.info("broker %s stopping", self.config.broker_name)
        try:
            await self._stop()
        except Exception:  # noqa: BLE001 - a step failing must not keep the process from exiting
            # (chaos seed 777: a slave record saved on a full disk while detaching: the broker
            # stayed up answering 503 and was never restarted)
            log.exception("stopping broker %s failed part way; exiting anyway", self.config.broker_name)
            if self.exit_code == 0:
                self.exit_code = EXIT_STORE_FAILED
        self._server = None
        self.stopped.set()
        log.info("broker %s stopped", self.config.broker_name)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for listener in (self._listener, self._admin_listener):
            if listener is not None:
                listener.close()
        await self._watcher.stop()
        await self.check_service.stop()
        await self.jobs.stop()
        await self.job_groups.stop()
        await self.participants.stop()
        await self.home_decisions.stop()
        await self.cluster.close()
        await self.schedule.stop()
        await self.retention.stop()
        await self.scrub.stop()
        if self.leader.active:
            self.leader.detach("the broker is stopping")
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if self.follower is not None:
            await self.follower.stop()
        for conn in list(self.connections):
            conn.close()
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
        await self.wal_sync.stop(sync=self.exit_code == 0)
        if self.exit_code == 0:
            await self.state.close()

    def replication_status(self) -> Replication:
        if self.role.is_master:
            refused = self.leader.incompatible()
            return Replication(mode=self.config.replication_mode, sync_replicas=self.config.sync_replicas,
                               slaves=self.leader.status(), last_error=refused, incompatible=refused,
                               recorded_slaves=sorted(self.leader.slaves.of_epoch(self.state.epoch)),
                               sync_set=None if self.leader.approved is None else sorted(self.leader.approved))
        return self.follower.status() if self.follower else Replication()

    async def _housekeep(self) -> None:
        loop = asyncio.get_running_loop()
        idle = self.config.idle_timeout_ms / 1000
        auth_timeout = self.config.auth_timeout_ms / 1000
        # at most a second; often enough that short timeouts (tests) are kept to within a quarter
        tick = max(0.05, min(1.0, auth_timeout / 4, idle / 4 if idle else 1.0))
        while True:
            before = loop.time()
            await asyncio.sleep(tick)
            now = loop.time()
            lag = now - before - tick
            self.metrics.loop_lag.observe(max(lag, 0.0))
            if lag > 0.5:  # everything on this broker waited that long: say so
                log.warning("event loop lagged %.2fs behind (the broker was blocked or starved of CPU)", lag)
            self.consumers.expire()
            for conn in list(self.connections):
                conn.sweep(now, idle, auth_timeout)
            self.unacked.publish()

    def _fatal(self, exc: BaseException) -> None:
        if is_corruption(exc):
            # RocksDB refuses every write once a compaction or flush met a damaged file (seed 443):
            # restarting on the same files meets it again, so it is damage, as a read's would be
            self.corrupted(exc, "RocksDB refused a write: a compaction or flush met a damaged file")
            return
        self.exit_code = EXIT_STORE_FAILED
        asyncio.get_running_loop().create_task(self.stop())

    def corrupted(self, exc: BaseException, how: str = "a read met a damaged file") -> None:
        """A read (or a compaction) met a damaged file: nothing of it was served. The broker stops, its
        store marked to be seeded from its master at the next start (as a slave; a master is failed
        over first)."""
        if self.exit_code == EXIT_STORE_DAMAGED:
            return
        log.critical("the store is damaged (%s): stopping; at the next start as a slave it is seeded from its "
                     "master (a copy of the master's store)", exc)
        self.metrics.store_damaged.inc()
        reseed(self.config.data_dir, f"{how}: {exc}")
        self.exit_code = EXIT_STORE_DAMAGED
        asyncio.get_running_loop().create_task(self.stop())

    def needs_seed(self, why: str) -> None:
        """This slave cannot go on from its own store (its master deleted records it needs)."""
        log.error("%s: stopping; the next start seeds this store from the master", why)
        reseed(self.config.data_dir, why)
        self.exit_code = EXIT_RESEED
        asyncio.get_running_loop().create_task(self.stop())
