"""The broker: wires storage, transactions, check-back, the data plane and the admin plane."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from txbroker.broker import processors
from txbroker.broker.admin import AdminApp
from txbroker.broker.check_service import CheckService
from txbroker.broker.config import BrokerConfig, parse_address
from txbroker.broker.connection import BrokerConnection
from txbroker.broker.consumers import ConsumerRegistry
from txbroker.broker.metrics import BrokerMetrics
from txbroker.broker.producers import ProducerRegistry
from txbroker.broker.replication.follower import ReplicationFollower
from txbroker.broker.replication.leader import ReplicationLeader
from txbroker.broker.replies import RequestError
from txbroker.broker.role import MASTER, SLAVE, RoleState
from txbroker.broker.schedule_service import ScheduleService, parse_delay_levels
from txbroker.broker.settings import SettingsBook
from txbroker.broker.topics import TopicRegistry
from txbroker.broker.transactions import TransactionService, now_ms
from txbroker.protocol.codes import ResponseCode
from txbroker.store.reads import MessageReader
from txbroker.store.records import EpochRecord
from txbroker.store.state import StateMachine

log = logging.getLogger(__name__)

EXIT_STORE_FAILED = 70


class Broker:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.metrics = BrokerMetrics()
        self.state = StateMachine(config.data_dir, config.flush_disk_type == "SYNC", self._fatal,
                                  self.metrics.observe_flush)
        self.reader = MessageReader(self.state)
        self.role = RoleState(config.role, lambda: self.state.epoch, config.master)
        levels = parse_delay_levels(config.message_delay_level)
        self.topics = TopicRegistry(self.state, config.auto_create_topic, config.default_queue_count,
                                    config.max_message_size, len(levels))
        self.settings = SettingsBook(config.transaction, self.state.db.meta)
        self.producers = ProducerRegistry(config.producer_expiry_ms)
        self.consumers = ConsumerRegistry(config.consumer_expiry_ms)
        self.schedule = ScheduleService(self, levels)
        self._housekeeping: asyncio.Task | None = None
        self.transactions = TransactionService(self.state, self.topics, self.role, self.metrics,
                                               config.reject_transaction_message)
        self.check_service = CheckService(self.state, self.reader, self.transactions, self.settings,
                                          self.producers, self.metrics)
        self.leader = ReplicationLeader(self)
        self.follower: ReplicationFollower | None = None
        self.handlers = processors.handlers(self)
        self.connections: set[BrokerConnection] = set()
        self.ready = False
        self.exit_code = 0
        self.stopped = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._admin_runner: web.AppRunner | None = None

    async def start(self) -> None:
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        host, port = parse_address(self.config.listen, "listen")
        self._server = await loop.create_server(lambda: BrokerConnection(self), host, port, reuse_address=True)
        ahost, aport = parse_address(self.config.admin_listen, "admin_listen")
        self._admin_runner = web.AppRunner(AdminApp(self).app, access_log=None)
        await self._admin_runner.setup()
        await web.TCPSite(self._admin_runner, ahost, aport, reuse_address=True).start()
        if self.role.is_master:
            if self.state.epoch == 0:  # a new master opens epoch 1
                await self.state.append(EpochRecord(1, self.config.broker_name, now_ms()))[1]
            self.leader.attach()
            self.check_service.start()
            self.schedule.start()
        elif self.config.master:
            self.follower = ReplicationFollower(self, self.config.master)
            self.follower.start()
        self._housekeeping = loop.create_task(self._housekeep())
        self.ready = True
        pending, parked = self.transactions.counts()
        log.info("broker %s started as %s at epoch %d in %.3fs (store recovered in %.3fs): data %s, admin %s, "
                 "flush %s, %d pending and %d parked transactions",
                 self.config.broker_name, self.role.role, self.role.epoch,
                 time.perf_counter() - t0 + self.state.recovery_seconds,
                 self.state.recovery_seconds, self.data_address, self.admin_address, self.config.flush_disk_type,
                 pending, parked)

    @property
    def data_address(self) -> str:
        sock = self._server.sockets[0].getsockname() if self._server else ("?", 0)
        return f"{sock[0]}:{sock[1]}"

    @property
    def admin_address(self) -> str:
        if self._admin_runner is None or not self._admin_runner.addresses:
            return "?"
        a = self._admin_runner.addresses[0]
        return f"{a[0]}:{a[1]}"

    async def stop(self) -> None:
        if not self.ready and self._server is None:
            return
        self.ready = False
        log.info("broker %s stopping", self.config.broker_name)
        if self._server is not None:
            self._server.close()
        await self.check_service.stop()
        await self.schedule.stop()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if self.follower is not None:
            await self.follower.stop()
        for conn in list(self.connections):
            conn.close()
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
        if self.exit_code == 0:
            await self.state.close()
        self._server = None
        self.stopped.set()
        log.info("broker %s stopped", self.config.broker_name)

    # ---- role changes (the operator calls these through the admin API) -------------------------

    async def promote(self, epoch: int) -> None:
        """Become master at `epoch`, which must be above every epoch this broker has seen."""
        if epoch <= self.state.epoch:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"promotion needs an epoch above the current {self.state.epoch}, got {epoch}")
        if self.follower is not None:
            await self.follower.stop()  # what was received is already applied
            self.follower = None
        await self.state.writer.drain()
        self.role.role = MASTER
        self.role.master_address = ""
        self.role.fenced_by = 0
        await self.state.append(EpochRecord(epoch, self.config.broker_name, now_ms()))[1]
        self.leader.attach()
        self.check_service.start()
        self.schedule.start()
        pending, parked = self.transactions.counts()
        log.warning("promoted to master at epoch %d at LSN %d; checking back %d pending transactions (%d parked)",
                    epoch, self.state.next_lsn - 1, pending, parked)

    async def demote(self, master: str, epoch: int) -> None:
        """Become a slave of `master`, which leads at `epoch` (not below ours)."""
        if epoch < self.state.epoch:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"the new master's epoch {epoch} is below this broker's {self.state.epoch}")
        self._step_down(f"demoted: the master is {master} at epoch {epoch}")
        await self.check_service.stop()
        await self.schedule.stop()
        self.role.master_address = master
        self.role.fenced_by = 0
        if self.follower is not None:
            await self.follower.stop()
        self.follower = ReplicationFollower(self, master)
        self.follower.start()
        log.warning("now a slave of %s (epoch %d)", master, epoch)

    def fence(self, epoch: int, why: str) -> None:
        """A higher epoch exists: stop acting as master at once (no split brain)."""
        if not self.role.is_master or epoch <= self.state.epoch:
            return
        log.error("fenced: %s, above our epoch %d; refusing writes and END_TRANSACTION from now on",
                  why, self.state.epoch)
        self._step_down(f"fenced by epoch {epoch}")
        self.role.fenced_by = epoch
        asyncio.ensure_future(self.check_service.stop())
        asyncio.ensure_future(self.schedule.stop())

    def _step_down(self, reason: str) -> None:
        self.role.role = SLAVE
        if self.leader.active:
            self.leader.detach(reason)

    def replication_status(self) -> dict:
        if self.role.is_master:
            return {"slaves": self.leader.status(), "mode": self.config.replication_mode,
                    "sync_replicas": self.config.sync_replicas}
        return self.follower.status() if self.follower else {"master": "", "connected": False}

    async def _housekeep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(1.0)
            lag = loop.time() - before - 1.0
            self.metrics.loop_lag.observe(max(lag, 0.0))
            if lag > 0.5:  # everything on this broker waited that long: say so
                log.warning("event loop lagged %.2fs behind (the broker was blocked or starved of CPU)", lag)
            self.consumers.expire()

    def _fatal(self, exc: BaseException) -> None:
        self.exit_code = EXIT_STORE_FAILED
        asyncio.get_running_loop().create_task(self.stop())
