"""The master's side of replication: one feed per subscribed slave, and SYNC acknowledgement.

Every push and heartbeat carries the master's published LSN: a slave serves readers no further
(a record only some slaves hold can still be taken away by a failover to another).

A feed is `live` when the slave is caught up: new batches are pushed to it as they are written.
Otherwise (new subscriber, or a slave too slow to take pushes) a catch-up task reads the log from
disk and streams it until the slave is caught up. SYNC mode answers a batch when `sync_replicas`
slaves have acknowledged it; with fewer slaves in sync it answers SLAVE_NOT_AVAILABLE at once,
and FLUSH_SLAVE_TIMEOUT if the acknowledgements do not come in time. In both cases the write is
stored on the master but not promised to survive a failover, so it is not published (readable)
until the slaves do have it; a retried request for it waits for that too (`wait`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from txbroker.protocol.admin import SlaveLink
from txbroker.broker.replication import compat
from txbroker.broker.replication.slave_record import SlaveRecord
from txbroker.broker.replies import RequestError, error, ok
from txbroker.protocol.bodies import ReplicaAck, ReplicaRecords, ReplicaSubscribe, ReplicaWelcome
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.store.group_commit import Batch, DurableFuture, answer
from txbroker.store.records import STORE_FORMAT_VERSION
from txbroker import __version__

log = logging.getLogger(__name__)

CHUNK_RECORDS = 512
CHUNK_BYTES = 1 << 20
MARKS = 3600  # log-end marks kept for the replication lag in seconds (one per heartbeat)
SILENT_HEARTBEATS = 5  # a link silent this many heartbeat intervals is dead (no FIN comes from a paused peer)
REFUSALS_SHOWN_S = 60.0  # a slave refused for its version is reported this long after its last try


class ReplicaFeed:
    __slots__ = ("conn", "name", "address", "next_lsn", "acked_lsn", "live", "task", "since", "heard", "sent",
                 "version", "store_format")

    def __init__(self, conn, name: str, address: str, next_lsn: int, version: str = "", store_format: int = 0):
        self.conn = conn
        self.name = name
        self.address = address
        self.version, self.store_format = version, store_format
        self.next_lsn = next_lsn
        self.acked_lsn = next_lsn - 1
        self.live = False
        self.task: asyncio.Task | None = None
        self.since = time.time()
        self.heard = self.sent = time.monotonic()  # the slave's last acknowledgement; our last push


class ReplicationLeader:
    def __init__(self, broker):
        self._broker = broker
        self._state = broker.state
        cfg = broker.config
        self.sync = cfg.replication_mode == "SYNC"
        self.sync_replicas = cfg.sync_replicas
        self.timeout = cfg.replication_timeout_ms / 1000
        self.heartbeat = cfg.replication_heartbeat_ms / 1000
        self.slaves = SlaveRecord(broker.state, cfg.broker_name)  # who may hold what this master acknowledged (probation)
        # Under a controller (--await-role-confirmation) a SYNC write counts only the slaves it
        # approved (approve), which it records before they count: so a failover knows every slave
        # that may hold an acknowledged write, however soon after joining the master dies. None:
        # every subscribed slave counts (no controller to tell). A slave forgotten (an approved one
        # holds all it had) leaves the set: the controller may then stop waiting for it.
        self.approved: set[str] | None = set() if cfg.await_role_confirmation else None
        self.slaves.on_forget = self._unapprove
        self._heartbeats: asyncio.Task | None = None
        self.feeds: dict[object, ReplicaFeed] = {}
        self.refused: dict[str, tuple[float, str]] = {}  # slave name -> (when, why): refused for its version
        self._progress: asyncio.Event | None = None  # set on every acknowledgement while someone waits (a handover)
        self._grace_until = 0.0  # just promoted: writes wait for slaves until then (attach)
        # Batches written and not yet published, in LSN order: [future, last LSN, deadline, answered].
        self._held: collections.deque[list] = collections.deque()
        self._waits: list[list] = []  # retried requests waiting for a record: [future, LSN, deadline]
        self._timer: asyncio.TimerHandle | None = None
        self.active = False
        # (monotonic time, log end) once a heartbeat interval while leading, the last hour's worth at
        # 1 s: how long ago a slave's first missing record was written (lag_seconds), for metrics.
        self._marks: collections.deque[tuple[float, int]] = collections.deque(maxlen=MARKS)

    # ---- lifecycle -----------------------------------------------------------------------------

    def attach(self, promoted: bool = False) -> None:
        """Lead. Just `promoted`, a SYNC master's slaves are still moving over to it (they could not
        subscribe before): for one replication timeout a write waits for them, as any SYNC write
        waits for its acknowledgements, instead of being refused at once for want of a slave."""
        self.active = self._broker.role.leading = True
        self._grace_until = time.monotonic() + self.timeout if promoted else 0.0
        self._marks.clear()
        self._state.replication_hold = self.hold
        self._heartbeats = asyncio.ensure_future(self._beat())
        if self.sync:
            self._state.replication_wait = self.wait
            self._state.publish_limit = None  # publication is this leader's from now on (_release)
        else:
            self._state.replication_wait = None
            self._state.publish_all()

    def detach(self, reason: str) -> None:
        """Stop leading (demoted or fenced): refuse what is not answered, drop the slaves. What is
        not published stays so: the new master decides whether it exists."""
        self.active = self._broker.role.leading = False
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            self._heartbeats = None
        # Nothing more becomes readable here until a master confirms it (or this broker leads again);
        # a retried request for what is not published is refused, not taken as published.
        self._state.publish_limit = self._state.durable_lsn
        self._state.replication_hold = None
        self._state.replication_wait = self._not_leading
        self._refuse(RequestError(ResponseCode.SLAVE_NOT_AVAILABLE, reason))
        self._held.clear()
        for feed in list(self.feeds.values()):
            self.remove(feed.conn)
            feed.conn.close()

    # ---- slaves come and go -----------------------------------------------------------------------

    def subscribe(self, conn, req: ReplicaSubscribe):
        if not self._broker.role.is_master:  # (on probation it still takes slaves: they are what it waits for)
            self._broker.role.require_master()
        state = self._state
        if req.epoch > state.epoch:
            self._broker.roles.fence(req.epoch, f"slave {req.slave_name} is at epoch {req.epoch}")
            return error(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                         f"this master is at epoch {state.epoch}, behind the slave's {req.epoch}")
        why = compat.slave_refusal(req)
        if why:
            if req.slave_name not in self.refused:
                log.error("refusing replication: %s", why)
            self.refused[req.slave_name] = (time.monotonic(), why)
            return error(ResponseCode.REPLICATION_INCOMPATIBLE, why)
        self.refused.pop(req.slave_name, None)
        if req.next_lsn < 1:
            return error(ResponseCode.MESSAGE_ILLEGAL, f"next_lsn must be at least 1, got {req.next_lsn}")
        if req.next_lsn < state.log_complete_from:  # (the slave seeds itself from a copy: replication/seed.py)
            return error(ResponseCode.PULL_OFFSET_MOVED,
                         f"slave {req.slave_name} needs records from LSN {req.next_lsn}, but retention deleted this "
                         f"master's records before {state.log_complete_from}: it must be seeded from a copy of the "
                         f"master's store")
        last = req.next_lsn - 1
        shared_end = state.shared_end(req.epochs, last) if req.epochs else (
            state.epoch_end(req.epoch) if req.epoch < state.epoch else state.next_lsn - 1)
        if last > shared_end and req.epoch == state.epoch and shared_end == state.next_lsn - 1:
            # records of this master's own epoch past its end: only this master wrote them, and it lost them
            self._broker.roles.lost_tail(req.slave_name, shared_end + 1, last)
            return error(ResponseCode.SLAVE_NOT_AVAILABLE, self._broker.role.stepped_down)
        if last > shared_end:
            log.warning("slave %s has records %d..%d this master does not share (its epoch %d, ours %d): "
                        "it must truncate after %d", req.slave_name, shared_end + 1, last, req.epoch, state.epoch,
                        shared_end)
            return ok(ReplicaWelcome(state.epoch, shared_end, __version__, STORE_FORMAT_VERSION))
        old = self.feeds.pop(conn, None)
        if old is not None and old.task is not None:
            old.task.cancel()
        for other in [f for f in self.feeds.values() if f.name == req.slave_name]:
            # its earlier link has not closed (a partition hides the FIN): one slave counts once
            log.warning("slave %s subscribed on a new connection; dropping its earlier one", req.slave_name)
            self.remove(other.conn)
            other.conn.close()
        self.slaves.subscribed(req.slave_name)
        if self.slaves.leaving:  # it holds its log to its end: a slave that left holding no more is forgotten
            self.slaves.acknowledged(req.slave_name, last)
        self._broker.roles.slave_shown(req.slave_name)
        feed = self.feeds[conn] = ReplicaFeed(conn, req.slave_name, req.address, req.next_lsn, req.version,
                                              req.store_format)
        feed.task = asyncio.ensure_future(self._catch_up(feed))
        log.info("slave %s (%s) subscribed from LSN %d; log end %d", req.slave_name, req.address or conn.peer,
                 req.next_lsn, state.next_lsn - 1)
        return ok(ReplicaWelcome(state.epoch, -1, __version__, STORE_FORMAT_VERSION))

    def remove(self, conn) -> None:
        feed = self.feeds.pop(conn, None)
        if feed is not None:
            if feed.task is not None:
                feed.task.cancel()
            log.warning("slave %s disconnected (acknowledged up to %d)", feed.name, feed.acked_lsn)
            self.slaves.left(feed.name, feed.next_lsn - 1, {f.name: f.acked_lsn for f in self.feeds.values()})
            if self._progress is not None:
                self._progress.set()

    def feed_of(self, slave: str) -> ReplicaFeed | None:
        """The link of the slave named `slave` (its broker name, or its data-plane address)."""
        return next((f for f in self.feeds.values() if slave in (f.name, f.address)), None)

    async def progress(self, timeout: float) -> None:
        """Until a slave acknowledges something or leaves, or `timeout` s pass."""
        self._progress = event = asyncio.Event()
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._progress = None

    def ack(self, conn, req: ReplicaAck) -> None:
        feed = self.feeds.get(conn)
        if feed is None:
            return
        if req.epoch > self._state.epoch:
            self._broker.roles.fence(req.epoch, f"slave {feed.name} acknowledged at epoch {req.epoch}")
            return
        feed.heard = time.monotonic()
        if req.durable_lsn > feed.acked_lsn:
            feed.acked_lsn = req.durable_lsn
            if self.slaves.leaving:
                self.slaves.acknowledged(feed.name, feed.acked_lsn)
            self._release()
            if self._progress is not None:
                self._progress.set()

    # ---- shipping ----------------------------------------------------------------------------------

    def hold(self, b: Batch) -> None:
        """Called for every batch written locally: push it to live slaves. ASYNC: publish and answer
        it now. SYNC: when they acknowledge it; without slaves in sync, refuse it at once. A batch
        filled while leading and written after this broker stepped down is refused: nothing of it
        is published or promised."""
        if not self.active:
            answer(b.future, RequestError(ResponseCode.SLAVE_NOT_AVAILABLE, self._not_leading_remark()))
            return
        if b.raw:
            epoch = self._state.epoch
            msg = None
            for feed in self.feeds.values():
                if feed.live:
                    if feed.next_lsn != b.first_lsn or not feed.conn.writable():
                        # too slow for pushes, or this batch does not start where the slave is (a push
                        # can only continue its log): catch up from disk instead
                        feed.live = False
                        feed.task = asyncio.ensure_future(self._catch_up(feed))
                        continue
                    if msg is None:
                        # what readers may see: ASYNC publishes this batch now, SYNC once slaves have it
                        msg = ReplicaRecords(b.first_lsn, b.raw, epoch,
                                             self._state.durable_lsn if self.sync else b.last_lsn)
                    feed.conn.send_oneway(RequestCode.REPLICATION_PUSH, msg)
                    feed.next_lsn = b.last_lsn + 1
                    feed.sent = time.monotonic()
        if not self.sync:
            self._state.publish_through(b.last_lsn)
            answer(b.future)
            return
        now = time.monotonic()
        self._held.append([b.future, b.last_lsn, now + self.timeout, False])
        if self.in_sync() < self.sync_replicas and now >= self._grace_until:
            self._refuse(RequestError(ResponseCode.SLAVE_NOT_AVAILABLE, self._no_slave_remark()))
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.timeout, self._expire)
        self._release()

    def wait(self, lsn: int) -> asyncio.Future:
        """A future for record `lsn`, written earlier and not yet published: it resolves when the
        slaves have it, or fails as a new write would now."""
        if self.in_sync() < self.sync_replicas and time.monotonic() >= self._grace_until:
            raise RequestError(ResponseCode.SLAVE_NOT_AVAILABLE, self._no_slave_remark())
        fut = DurableFuture(loop=asyncio.get_running_loop())
        self._waits.append([fut, lsn, time.monotonic() + self.timeout])
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.timeout, self._expire)
        return fut

    def _not_leading(self, lsn: int) -> asyncio.Future:
        raise RequestError(ResponseCode.SLAVE_NOT_AVAILABLE, self._not_leading_remark())

    def _not_leading_remark(self) -> str:
        role = self._broker.role
        why = role.stepped_down or (f"fenced by epoch {role.fenced_by}" if role.fenced_by else "")
        return (f"this broker stopped leading ({why}) before the write was replicated: it is not promised" if why
                else "this broker stopped leading before the write was replicated: it is not promised")

    def in_sync(self) -> int:
        approved = self.approved   # (counts, inline: this runs on every held write)
        return sum(1 for f in self.feeds.values() if f.live and (approved is None or f.name in approved))

    def counts(self, slave: str) -> bool:
        """Whether `slave`'s acknowledgements count for a SYNC write."""
        return self.approved is None or slave in self.approved

    def approve(self, slaves) -> None:
        """The controller's set of slaves whose acknowledgements count (it recorded them first)."""
        self.approved = set(slaves)
        self._release()  # a held write some newly approved slave holds already

    def _unapprove(self, slave: str, by: str | None) -> None:
        """`slave` forgotten: it leaves the approved set if a person said it is gone for good (None),
        or if an approved slave holds all it had (`by`) and one acknowledgement makes a write (with
        k of them, another holder of each write it acknowledged may be among the k - 1 others, so
        failover's n - k + 1 would no longer reach one); else the controller keeps waiting for it."""
        if self.approved is not None and (by is None or (self.sync_replicas <= 1 and by in self.approved)):
            self.approved.discard(slave)

    def _no_slave_remark(self) -> str:
        return (f"SYNC replication needs {self.sync_replicas} slave(s) in sync, {self.in_sync()} connected and caught up: "
                f"stored on the master only")

    def replicated_lsn(self) -> int:
        """The highest LSN that `sync_replicas` slaves have acknowledged."""
        need = self.sync_replicas
        if not need:
            return self._state.local_durable_lsn
        approved = self.approved   # (counts, inline: this runs on every slave acknowledgement)
        acked = sorted((f.acked_lsn for f in self.feeds.values() if approved is None or f.name in approved),
                       reverse=True)
        return acked[need - 1] if len(acked) >= need else 0

    def _release(self) -> None:
        if not self.sync:
            return
        replicated = self.replicated_lsn()
        state = self._state
        if replicated > state.durable_lsn:
            state.publish_through(replicated)
        held = self._held
        while held and held[0][1] <= replicated:
            fut, _lsn, _deadline, answered = held.popleft()
            if not answered:
                answer(fut)
        if self._waits:
            still = []
            for w in self._waits:
                if w[1] <= replicated:
                    answer(w[0])
                else:
                    still.append(w)
            self._waits = still

    def _expire(self) -> None:
        self._timer = None
        now = time.monotonic()
        timeout = RequestError(ResponseCode.FLUSH_SLAVE_TIMEOUT,
                               f"no acknowledgement from {self.sync_replicas} slave(s) within "
                               f"{self.timeout:.1f}s: stored on the master only")
        nxt = None
        for entry in self._held:  # in LSN order, so deadline order
            if entry[3]:
                continue
            if entry[2] > now:
                nxt = entry[2]
                break
            entry[3] = True
            answer(entry[0], timeout)
        still = []
        for w in self._waits:
            if w[2] <= now:
                answer(w[0], timeout)
            else:
                still.append(w)
                nxt = w[2] if nxt is None else min(nxt, w[2])
        self._waits = still
        if nxt is not None:
            self._timer = asyncio.get_running_loop().call_later(max(nxt - now, 0.001), self._expire)

    def _refuse(self, err: RequestError) -> None:
        """Answer every request still waiting with `err`; what they wrote stays held until published."""
        for entry in self._held:
            if not entry[3]:
                entry[3] = True
                answer(entry[0], err)
        for w in self._waits:
            answer(w[0], err)
        self._waits = []

    async def _catch_up(self, feed: ReplicaFeed) -> None:
        state = self._state
        try:
            while self.feeds.get(feed.conn) is feed:
                end = state.local_durable_lsn
                if feed.next_lsn > end:
                    feed.live = True
                    self._release()
                    return
                records = state.log_records(feed.next_lsn, end, CHUNK_RECORDS, CHUNK_BYTES)
                feed.conn.send_oneway(RequestCode.REPLICATION_PUSH, ReplicaRecords(feed.next_lsn, records, state.epoch,
                                                                                   state.durable_lsn))
                feed.next_lsn += len(records)
                feed.sent = time.monotonic()
                await feed.conn.drained()
        except asyncio.CancelledError:
            pass

    async def _beat(self) -> None:
        """Heartbeats on idle links, and dropping links whose slave has gone silent."""
        silent = SILENT_HEARTBEATS * self.heartbeat
        while True:
            await asyncio.sleep(self.heartbeat)
            now = time.monotonic()
            self._marks.append((now, self._state.next_lsn - 1))
            for feed in list(self.feeds.values()):
                if now - feed.heard > silent:
                    log.warning("slave %s silent for %.1fs (paused or cut off?): dropping its link", feed.name,
                                now - feed.heard)
                    self.remove(feed.conn)
                    feed.conn.close()
                elif now - feed.sent >= self.heartbeat:
                    feed.conn.send_oneway(RequestCode.REPLICATION_PUSH,
                                          ReplicaRecords(feed.next_lsn, [], self._state.epoch, self._state.durable_lsn))
                    feed.sent = now

    def lag_seconds(self, acked_lsn: int, now: float | None = None) -> float:
        """How long ago the first record a slave has not acknowledged was written, at least: 0 when
        it holds everything or that record is younger than the last mark (a heartbeat interval)."""
        now = time.monotonic() if now is None else now
        for t, end in self._marks:
            if end > acked_lsn:
                return max(0.0, now - t)
        return 0.0

    def status(self) -> list[SlaveLink]:
        end = self._state.next_lsn - 1
        return [SlaveLink(f.name, f.address or f.conn.peer, f.acked_lsn, end - f.acked_lsn,
                          f.live and self.counts(f.name), f.version, f.store_format) for f in self.feeds.values()]

    def incompatible(self) -> str:
        """The slaves refused for their version lately (each tries again now and then), and why."""
        now = time.monotonic()
        for name in [n for n, (at, _) in self.refused.items() if now - at > REFUSALS_SHOWN_S]:
            del self.refused[name]
        return "; ".join(why for _, why in self.refused.values())
