"""The slave's side of replication: subscribe to the master, apply its records, acknowledge them.

Runs until stopped, reconnecting with backoff. If the master says the slave holds records it does
not share (a deposed master coming back), the slave truncates them and rebuilds its state before
subscribing again.
"""

from __future__ import annotations

import asyncio
import logging
import random

from txbroker.protocol.admin import Replication
from txbroker.client.connection import Connection, ConnectionLost
from txbroker.client.errors import ClientError, RequestTimeout
from txbroker.client.log_limit import RepeatedWarnings
from txbroker.client.security import Credentials, authenticate
from txbroker.lifecycle import stop_task
from txbroker.store.db import StoreError
from txbroker.protocol.bodies import ErrorBody, ReplicaAck, ReplicaRecords, ReplicaSubscribe, ReplicaWelcome, decoder, encode
from txbroker.protocol.codes import RequestCode, ResponseCode, code_name
from txbroker.protocol.framing import Frame
from txbroker.broker.replication import compat
from txbroker.broker.replication.leader import SILENT_HEARTBEATS
from txbroker.store.records import READABLE_FORMATS, STORE_FORMAT_VERSION
from txbroker import __version__

log = logging.getLogger(__name__)
_warnings = RepeatedWarnings(log)

_records = decoder(ReplicaRecords)
_welcome = decoder(ReplicaWelcome)
_error = decoder(ErrorBody)

INCOMPATIBLE_RETRY_S = 10.0  # a master refused for its version is asked again this often (it may be replaced)


SOON_S = 5.0  # for this long after it starts, a follower whose master is not master yet asks again at once


class NotMasterYet(Exception):
    """The master to follow is still a slave (it is about to be promoted)."""


class Incompatible(Exception):
    """The master and this broker cannot replicate: their versions do not work together."""


class ReplicationFollower:
    def __init__(self, broker, master: str):
        self._broker = broker
        self._state = broker.state
        self.master = master
        self.connected = False
        self.last_error = ""
        self.incompatible = ""  # why replication stopped for the two brokers' versions (compat.py), or ""
        self.master_version, self.master_store_format = "", 0
        self._conn: Connection | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._heard = 0.0  # loop time of the master's last push or heartbeat
        self.master_published: int | None = None  # how far the master had published at its last word (this link)

    def start(self) -> None:
        self._since = self._loop_time()
        self._task = asyncio.ensure_future(self._run())

    @staticmethod
    def _loop_time() -> float:
        return asyncio.get_running_loop().time()

    async def stop(self) -> None:
        self._stopping = True
        if self._conn is not None:
            self._conn.close()
        await stop_task(self._task)
        self._task = None
        self.connected = False

    async def _run(self) -> None:
        delay = 0.05
        while not self._stopping:
            try:
                if await self._session():
                    delay = 0.05
                    continue
            except (OSError, asyncio.TimeoutError, ConnectionLost, RequestTimeout) as e:
                self.last_error = f"{type(e).__name__}: {e}"
                log.info("replication from %s: %s; retrying", self.master, self.last_error)
            except NotMasterYet:
                await asyncio.sleep(0.02)
                continue
            except Incompatible as e:  # nothing replicated: say so, and ask again now and then
                if str(e) != self.incompatible:
                    log.error("replication from %s stopped: %s", self.master, e)
                else:
                    _warnings.warning("incompatible", "replication from %s still stopped: %s", self.master, e)
                self.last_error = self.incompatible = str(e)
                delay = INCOMPATIBLE_RETRY_S
            except StoreError as e:  # its log cannot be cut back to its master's: a copy of the master's data is needed
                self.last_error = str(e)
                _warnings.warning("cannot rejoin", "replication from %s: %s", self.master, e)
                delay = 5.0
            except ClientError as e:  # refused credentials, TLS: say so loudly, keep trying (they may be fixed)
                self.last_error = f"{type(e).__name__}: {e}"
                log.error("replication from %s: %s; retrying", self.master, self.last_error)
                if self._conn is not None:
                    self._conn.close()
            except Exception:  # a bug must not end replication silently
                log.exception("replication from %s failed; retrying", self.master)
            self.connected = False
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 2.0)

    async def _session(self) -> bool:
        """One connection's life. True: reconnect at once (after a truncation)."""
        tls = self._broker.tls.replication
        conn = self._conn = Connection(self.master, self._on_push, ssl_context=tls,
                                       server_hostname=self._broker.config.tls_server_name or None)
        await conn.open(3.0)
        if self._stopping:
            conn.close()
            return False
        creds = self._broker.replication_credentials
        if creds is not None:
            await authenticate(conn, Credentials(*creds), 10.0)
        state = self._state
        req = ReplicaSubscribe(self._broker.config.broker_name, state.next_lsn, state.epoch,
                               self._broker.config.listen, list(state.epochs), __version__, STORE_FORMAT_VERSION,
                               sorted(READABLE_FORMATS))
        frame = await conn.call(RequestCode.REPLICATION_SUBSCRIBE, encode(req), 10.0)
        if frame.code != ResponseCode.SUCCESS:
            self.last_error = f"{code_name(frame.code)}: {_error.decode(frame.body).remark}"
            conn.close()
            if frame.code == ResponseCode.REPLICATION_INCOMPATIBLE:
                raise Incompatible(f"master {self.master} refused it: {_error.decode(frame.body).remark}")
            if frame.code == ResponseCode.SLAVE_NOT_AVAILABLE and self._loop_time() - self._since < SOON_S:
                # not master yet: made a follower of a slave about to be promoted (a switchover, a
                # failover): ask again at once, so that it has its slaves as it starts taking writes
                _warnings.warning("not master yet", "%s is not master yet (%s); subscribing again", self.master,
                                  self.last_error)
                raise NotMasterYet()
            if frame.code == ResponseCode.PULL_OFFSET_MOVED:  # its master deleted what it needs: seed anew
                self._stopping = True
                self._broker.needs_seed(f"master {self.master} refused replication: {self.last_error}")
                return False
            log.warning("master %s refused replication: %s", self.master, self.last_error)
            return False
        welcome = _welcome.decode(frame.body)
        self.master_version, self.master_store_format = welcome.version, welcome.store_format
        why = compat.master_refusal(self.master, welcome)
        if why:
            conn.close()
            raise Incompatible(why)
        self.incompatible = ""
        if welcome.truncate_after >= 0:
            conn.close()
            try:
                await state.truncate_after(welcome.truncate_after)
            except StoreError as e:  # retention passed the cut: only a copy of the master's store will do
                self._stopping = True
                self._broker.needs_seed(f"cannot rejoin master {self.master}: {e}")
                return False
            return True
        self.master_published = None
        if state.publish_limit is None:  # until the master says how far it published: no further than now
            state.publish_limit = state.durable_lsn
        self.connected = True
        self.last_error = ""
        log.info("replicating from %s (epoch %d) from LSN %d", self.master, welcome.master_epoch, req.next_lsn)
        return await self._watch(conn)

    async def _watch(self, conn: Connection) -> bool:
        """Until the link closes, or the master goes silent (paused or cut off: no FIN comes)."""
        loop = asyncio.get_running_loop()
        beat = self._broker.config.replication_heartbeat_ms / 1000
        self._heard = loop.time()
        while not conn.closed.is_set():
            try:
                await asyncio.wait_for(conn.closed.wait(), beat)
            except asyncio.TimeoutError:
                silent = loop.time() - self._heard
                if silent > SILENT_HEARTBEATS * beat:
                    self.last_error = f"the master was silent for {silent:.1f}s (paused or cut off?)"
                    log.warning("replication from %s: %s; reconnecting", self.master, self.last_error)
                    conn.close()
                    self.connected = False
                    return False
        log.warning("replication connection to %s closed", self.master)
        return False

    def _on_push(self, frame: Frame) -> None:
        if frame.code != RequestCode.REPLICATION_PUSH:
            return
        conn = self._conn
        self._heard = asyncio.get_running_loop().time()
        try:
            batch = _records.decode(frame.body)
            if batch.master_epoch < self._state.epoch:
                log.error("ignoring records from %s at epoch %d, older than ours (%d)", self.master,
                          batch.master_epoch, self._state.epoch)
                conn.close()
                return
            fut = None
            for i, raw in enumerate(batch.records):
                fut = self._state.apply_replicated(batch.first_lsn + i, raw)
            self._state.follow_published(batch.published)
            self.master_published = batch.published
        except ValueError as e:  # a gap or overlap: subscribe again from our log end
            log.warning("replication from %s out of step (%s); resubscribing", self.master, e)
            conn.close()
            return
        if fut is not None:
            last = batch.first_lsn + len(batch.records) - 1
            fut.add_done_callback(lambda f, c=conn, n=last: self._ack(c, f, n))
        elif not batch.records:  # a heartbeat: answer it, so the master knows this slave is alive
            conn.send_oneway(RequestCode.REPLICATION_ACK,
                             encode(ReplicaAck(self._state.local_durable_lsn, self._state.epoch)))

    def _ack(self, conn: Connection, fut: asyncio.Future, lsn: int) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        conn.send_oneway(RequestCode.REPLICATION_ACK, encode(ReplicaAck(lsn, self._state.epoch)))

    def out_of_sync(self, fresh_heartbeats: int) -> str:
        """Why this slave is not in sync with its master ("" if it is): connected, heard from it within
        `fresh_heartbeats` heartbeat intervals, and holding all it had published then (a backup's rule)."""
        where = f"slave {self._broker.config.broker_name} is not in sync with its master {self.master}"
        if not self.connected:
            return f"{where}: not connected ({self.last_error or 'connecting'})"
        silent = self._loop_time() - self._heard
        beat = self._broker.config.replication_heartbeat_ms / 1000
        if self.master_published is None or silent > fresh_heartbeats * beat:
            return f"{where}: nothing heard from it for {silent:.1f}s (paused or cut off?)"
        held = self._state.next_lsn - 1
        if held < self.master_published:
            return f"{where}: it holds the log to LSN {held}, its master had published LSN {self.master_published}"
        return ""

    def status(self) -> Replication:
        return Replication(master=self.master, connected=self.connected, replicated_offset=self._state.durable_lsn,
                           last_error=self.last_error or "", incompatible=self.incompatible,
                           master_version=self.master_version, master_store_format=self.master_store_format)
