"""Role changes of one broker: promotion, demotion and fencing. The operator (or the fault harness,
or a user through the admin API) decides them (operator/failover.py); this carries them out on the
broker, and fences a master that learns of a higher epoch from a slave or a client. Epochs order the
masters: a broker never acts as master at an epoch a newer master has passed.

A master that starts again under SYNC replication may have lost records its slaves have: to a
power cut under ASYNC flush (it answered them before fsync, once a slave had them), or, under
either flush, to a damaged write-ahead log cut short, which recovers as a crash's (seed 450). It
would cut them off the slaves, or write other records at their offsets under the same epoch. So it
starts on probation: it takes no write until a slave subscribes and shows it is not behind; a slave ahead at
its own epoch makes it step down, for the operator to promote that slave (`lost_tail`).

Under a controller (--await-role-confirmation), a master that starts again on a store it led also
takes no write until the controller confirms it (`confirm`): its role comes from its pod, which
may have been read before a promotion it missed while it was down, and a slave restarted as
stale would acknowledge its writes; the new master never has them (the fault schedules, seed 3)."""

from __future__ import annotations

import asyncio
import logging

from txbroker.broker.replication.follower import ReplicationFollower
from txbroker.broker.replies import RequestError
from txbroker.broker.role import MASTER, SLAVE
from txbroker.broker.transaction.service import now_ms
from txbroker.client.connection import Connection, ConnectionLost
from txbroker.client.errors import ClientError
from txbroker.client.security import Credentials, authenticate
from txbroker.protocol.bodies import HeartbeatRequest, HeartbeatResponse, decoder, encode
from txbroker.protocol.codes import RequestCode, ResponseCode
from txbroker.store.records import EpochRecord

log = logging.getLogger(__name__)


class RoleChanges:
    def __init__(self, broker):
        self._b = broker
        self._checking_master: asyncio.Task | None = None
        self._stepped_down: asyncio.Event | None = None   # set when this broker stops acting as master
        self._awaited: set[str] = set()  # on probation: the recorded slaves not yet heard from

    async def not_master(self) -> None:
        """Until this broker no longer acts as master (handed over, demoted, fenced)."""
        if self._stepped_down is None:
            self._stepped_down = asyncio.Event()
        if self._b.role.is_master:
            await self._stepped_down.wait()

    async def promote(self, epoch: int, sync_set: list[str] | None = None) -> None:
        """Become master at `epoch`, which must be above every epoch this broker has seen; under a
        controller, `sync_set` names the slaves whose acknowledgements count from the start."""
        self._refuse_while_truncating()
        if epoch <= self._b.state.epoch:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"promotion needs an epoch above the current {self._b.state.epoch}, got {epoch}")
        if self._b.follower is not None:
            await self._b.follower.stop()  # what was received is already applied
            self._b.follower = None
        await self._b.state.drain()
        self._b.state.publish_limit = None  # its own publication from now on (the leader's rule)
        self._b.role.role = MASTER
        if self._stepped_down is not None:
            self._stepped_down.clear()
        self._b.role.master_address = ""
        self._b.role.fenced_by = 0
        self._b.role.probation = self._b.role.stepped_down = self._b.role.unconfirmed = ""
        await self._b.state.append(EpochRecord(epoch, self._b.config.broker_name, now_ms()))[1]
        if self._b.leader.approved is not None:
            self._b.leader.approved = set(sync_set or ())  # the new epoch's: none carries over
        self._b.leader.attach(promoted=True)
        self.start_master_services()
        pending, parked = self._b.transactions.counts()
        log.warning("promoted to master at epoch %d at LSN %d; checking back %d pending transactions (%d parked)",
                    epoch, self._b.state.next_lsn - 1, pending, parked)

    def start_master_services(self) -> None:
        """What only a master runs: check-back, job deadlines and spans, participants, a home's
        decisions, delayed delivery."""
        self._b.check_service.start()
        self._b.jobs.start()
        self._b.job_groups.start()
        self._b.participants.start()
        self._b.home_decisions.start()
        self._b.schedule.start()

    def begin_probation(self) -> None:
        """Every slave recorded while this master led its epoch may hold what it acknowledged and
        then lost: it waits for each (one behind may come back first). None recorded (a store from
        before the record): the first slave ends it."""
        self._awaited = self._b.leader.slaves.of_epoch(self._b.state.epoch)
        self._describe_probation()
        log.warning("started as master under SYNC replication: taking no write until %s subscribes and shows "
                    "this log is not behind its own (a power cut under ASYNC flush, or a damaged log, may have "
                    "taken records the slaves have)",
                    "each of slaves " + ", ".join(sorted(self._awaited)) if self._awaited else "a slave")

    def _describe_probation(self) -> None:
        waiting = f"; waiting for slave(s) {', '.join(sorted(self._awaited))}" if self._awaited else ""
        self._b.role.probation = ("this master started again and takes no write until a slave shows it lost "
                                  f"nothing (to a power cut under ASYNC flush, or a damaged log){waiting}")

    def slave_shown(self, slave: str) -> None:
        """Slave `slave` subscribed and is not ahead of this log."""
        if not self._b.role.probation:
            return
        self._awaited.discard(slave)
        if self._awaited:
            log.warning("slave %s is not ahead of this log; still waiting for %s", slave, ", ".join(sorted(self._awaited)))
            self._describe_probation()
            return
        self._end_probation(f"slave {slave} is not ahead of this log")

    def forget_slave(self, slave: str) -> bool:
        """A slave gone for good (its store lost, the group scaled down): no probation waits for it.
        What only it held of this master's acknowledged writes is lost with it. A slave subscribed
        now is refused: forgotten while it acknowledges, it would hold writes no record names."""
        if self._b.leader.feed_of(slave) is not None:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"slave {slave} is subscribed to this master now: only a slave gone for good is "
                               "forgotten (stop it first)")
        forgotten = self._b.leader.slaves.forget(slave)
        if self._b.role.probation and slave in self._awaited:
            self._awaited.discard(slave)
            forgotten = True
            if not self._awaited and self._b.leader.feeds:  # the slaves subscribed showed this log whole
                self._end_probation(f"slave {slave} forgotten, and every other slave is not ahead of this log")
            else:
                self._describe_probation()
        if forgotten:
            log.warning("slave %s forgotten: no probation waits for it (what only it held is lost)", slave)
        return forgotten

    def _end_probation(self, why: str) -> None:
        self._b.role.probation = ""
        log.warning("%s%s", why, ": taking writes" if not self._b.role.unconfirmed else "")
        if not self._b.role.unconfirmed:
            self.start_master_services()

    def await_confirmation(self) -> None:
        epoch = self._b.state.epoch
        self._b.role.unconfirmed = (f"this master started again at epoch {epoch} and takes no write until its "
                                    "controller confirms it still is the master (another may have been promoted "
                                    "while it was down)")
        log.warning("started as master at epoch %d: taking no write until the controller confirms this broker "
                    "still is the master", epoch)

    def confirm(self, epoch: int, sync_set: list[str] | None = None) -> None:
        """The controller's word that this master still leads at `epoch`, its own (said again: no
        change), and, under a controller, which slaves' acknowledgements count (`sync_set`)."""
        role, ours = self._b.role, self._b.state.epoch
        if not role.is_master or role.stepped_down:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"only a master is confirmed at its epoch; this broker is "
                               f"{role.stepped_down or role.role} at epoch {ours}")
        if epoch != ours:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"this master is at epoch {ours}: it is confirmed at {ours} or promoted above it, "
                               f"got {epoch}")
        if sync_set is not None and self._b.leader.approved is not None:
            self._b.leader.approve(sync_set)
        if role.unconfirmed:
            role.unconfirmed = ""
            log.warning("the controller confirmed this broker as master at epoch %d%s", epoch,
                        ": taking writes" if not role.probation else "")
            if not role.probation:
                self.start_master_services()

    def lost_tail(self, slave: str, first: int, last: int) -> None:
        """Slave `slave` holds records `first`..`last` of this master's own epoch, which this master
        no longer has: it lost them (a power cut under ASYNC flush, a damaged log). Step down, for
        the operator to promote a slave that has them; never cut them off the slave."""
        why = (f"lost records its slave {slave} has ({first}..{last}, epoch {self._b.state.epoch}): a power cut or a "
               f"damaged log; a slave holding them must be promoted")
        log.error("this master %s; stepping down: it takes no write, and the operator's failover promotes the most "
                  "caught-up slave", why)
        self._step_down(f"this master {why}")
        self._b.role.probation = self._b.role.unconfirmed = ""
        self._b.role.stepped_down = f"this broker was master and {why}"
        asyncio.ensure_future(self._stop_master_services())

    async def _stop_master_services(self) -> None:
        await self._b.check_service.stop()
        await self._b.jobs.stop()
        await self._b.job_groups.stop()
        await self._b.participants.stop()
        await self._b.home_decisions.stop()
        await self._b.schedule.stop()

    async def demote(self, master: str, epoch: int) -> None:
        """Become a slave of `master`, which leads at `epoch` (not below ours)."""
        self._refuse_while_truncating()
        if epoch < self._b.state.epoch:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"the new master's epoch {epoch} is below this broker's {self._b.state.epoch}")
        self._step_down(f"demoted: the master is {master} at epoch {epoch}")
        await self._stop_master_services()
        self._b.role.probation = self._b.role.stepped_down = self._b.role.unconfirmed = ""
        self._b.role.master_address = master
        self._b.role.fenced_by = 0
        if self._b.follower is not None:
            await self._b.follower.stop()
        self._b.follower = ReplicationFollower(self._b, master)
        self._b.follower.start()
        log.warning("now a slave of %s (epoch %d)", master, epoch)

    async def hand_over(self, successor: str, epoch: int, timeout: float) -> int:
        """A planned move of mastership (a switchover): take no write, wait until `successor` (a slave
        replicating from this master: its broker name or address) has acknowledged this log to its
        exact end, then become its slave at `epoch`, which the caller then promotes it at. So the old
        master is fenced only once the new one has everything: nothing acknowledged is lost, under
        ASYNC replication too (a failover's fence-first may lose what the slave had not received).
        Client requests that come meanwhile wait (dispatch.py's gate) and are answered once it is
        done ("not master": clients move to the successor) or abandoned. Returns the LSN handed over
        at. Refused, changing nothing, when there is no such slave, it is not in sync (not fed live:
        catching up from disk) or the epoch is not above this broker's; abandoned (this broker takes
        writes again, as master) when the successor has not caught up within `timeout` s or leaves."""
        b, role = self._b, self._b.role
        self._refuse_while_truncating()
        if not role.is_master or role.on_hold or role.stepped_down:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION, "only a master taking writes hands over; this broker is "
                               + (role.on_hold or role.stepped_down or f"a {role.role}"))
        if role.handover:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION, f"this master is already handing over {role.handover}")
        if epoch <= b.state.epoch:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"the successor's epoch must be above this master's {b.state.epoch}, got {epoch}")
        feed = b.leader.feed_of(successor)
        if feed is None:
            names = ", ".join(f"{f.name} ({f.address})" for f in b.leader.feeds.values()) or "none"
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"{successor} is not a slave replicating from this master (its slaves: {names})")
        if not feed.live:   # catching up from disk: writes would stall until it is through, or the timeout
            live = ", ".join(f"{f.name} ({f.address})" for f in b.leader.feeds.values() if f.live) or "none"
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"{feed.name} ({feed.address}) is not in sync with this master: it has acknowledged up "
                               f"to LSN {feed.acked_lsn} of {b.state.next_lsn - 1} and catches up from disk; hand "
                               f"over to a slave in sync (now: {live})")
        loop = asyncio.get_running_loop()
        role.handover = f"to {feed.name} ({feed.address}) at epoch {epoch}"
        role.gate = loop.create_future()
        started = loop.time()
        log.warning("handing over %s: taking no write until it holds this log to its end (LSN %d)", role.handover,
                    b.state.next_lsn - 1)
        try:
            await self._stop_master_services()
            deadline = started + timeout
            while not (role.is_master and b.leader.feeds.get(feed.conn) is feed
                       and feed.acked_lsn >= b.state.next_lsn - 1):
                if not role.is_master or b.leader.feeds.get(feed.conn) is not feed or loop.time() >= deadline:
                    why = ("this broker was fenced meanwhile" if not role.is_master else
                           f"{feed.name} disconnected" if b.leader.feeds.get(feed.conn) is not feed else
                           f"{feed.name} acknowledged up to LSN {feed.acked_lsn} of {b.state.next_lsn - 1} "
                           f"within {timeout:.1f}s")
                    raise RequestError(ResponseCode.SERVICE_NOT_AVAILABLE, f"handover {role.handover} abandoned: "
                                       f"{why}" + ("; this broker takes writes again" if role.is_master else ""))
                await b.leader.progress(deadline - loop.time())
            # from the check above to here nothing yields: the successor holds everything written
            end = b.state.next_lsn - 1
            self._step_down(f"handed over to {feed.name} at epoch {epoch}")
            role.master_address = feed.address
            if b.follower is not None:
                await b.follower.stop()
            b.follower = ReplicationFollower(b, feed.address)
            b.follower.start()
            log.warning("handed over to %s at LSN %d in %.3fs: now its slave (epoch %d once it is promoted)",
                        feed.name, end, loop.time() - started, epoch)
            return end
        except BaseException:
            if role.is_master and not role.fenced_by:
                self.start_master_services()
            log.warning("handover %s abandoned after %.3fs", role.handover, loop.time() - started)
            raise
        finally:
            role.handover = ""
            gate, role.gate = role.gate, None
            gate.set_result(None)

    def check_newer_master(self, address: str, epoch: int, told_by: str) -> None:
        """Someone says `address` leads at `epoch`, above ours: ask it, and fence if it does. (Not
        taken on trust: a client's word alone must not depose a master.)"""
        if self._checking_master is not None and not self._checking_master.done():
            return
        self._checking_master = asyncio.ensure_future(self._check_newer_master(address, epoch, told_by))

    async def _check_newer_master(self, address: str, epoch: int, told_by: str) -> None:
        conn = Connection(address, ssl_context=self._b.tls.replication,
                          server_hostname=self._b.config.tls_server_name or None)
        try:
            await conn.open(3.0)
            if self._b.replication_credentials is not None:
                await authenticate(conn, Credentials(*self._b.replication_credentials), 3.0)
            frame = await conn.call(RequestCode.HEARTBEAT, encode(HeartbeatRequest(f"broker-{self._b.config.broker_name}")),
                                    3.0)
            if frame.code != ResponseCode.SUCCESS:
                return
            hb = decoder(HeartbeatResponse).decode(frame.body)
            if hb.role == MASTER and hb.epoch > self._b.state.epoch:
                self.fence(hb.epoch, f"{address} leads at epoch {hb.epoch} ({told_by} said so, and it does)")
        except (ClientError, ConnectionLost, OSError, asyncio.TimeoutError) as e:
            log.info("could not check %s's claim to lead at epoch %d (%s said so): %s", address, epoch, told_by, e)
        finally:
            conn.close()

    def _refuse_while_truncating(self) -> None:
        if self._b.state.truncating:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               "this broker is truncating its log to rejoin its master; change its role when done")

    def fence(self, epoch: int, why: str) -> None:
        """A higher epoch exists: stop acting as master at once (no split brain)."""
        if not self._b.role.is_master or epoch <= self._b.state.epoch:
            return
        log.error("fenced: %s, above our epoch %d; refusing writes and END_TRANSACTION from now on",
                  why, self._b.state.epoch)
        self._step_down(f"fenced by epoch {epoch}")
        self._b.role.fenced_by = epoch
        asyncio.ensure_future(self._b.check_service.stop())
        asyncio.ensure_future(self._b.jobs.stop())
        asyncio.ensure_future(self._b.job_groups.stop())
        asyncio.ensure_future(self._b.participants.stop())
        asyncio.ensure_future(self._b.home_decisions.stop())
        asyncio.ensure_future(self._b.schedule.stop())

    def _step_down(self, reason: str) -> None:
        self._b.role.role = SLAVE
        if self._b.leader.active:
            self._b.leader.detach(reason)
        if self._stepped_down is not None:
            self._stepped_down.set()
