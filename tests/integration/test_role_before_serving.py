"""A SYNC master acknowledges a write only once a slave has it, from its very first request.

Found by the node's fault schedule (seed 10): a master killed again and again by the kubelet's
restarts answered a plain send SUCCESS in the moment after it opened its data port and before it
led (its replication not yet attached: a write there was published and answered at once). The
operator then promoted a slave that never had it, and the message was gone. The same moment
exists on a promotion (the role said master while the epoch record was being written).

These run a real broker in this process, so a request can be sent exactly in that moment.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from aiohttp import web

from txbroker.broker.config import load_config
from txbroker.broker.server import Broker
from txbroker.client import AsyncProducer, Message
from txbroker.client.errors import ClientError
from txbroker.store.records import EpochRecord

SYNC = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "replication_mode": "SYNC",
        "flush_disk_type": "SYNC", "replication_timeout_ms": 300, "log_level": "WARNING"}


def config(tmp_path, **more):
    return load_config(None, {**SYNC, "data_dir": str(tmp_path / "data"), **more})


async def try_send(address: str) -> str:
    """What a producer sending one message now is told: 'acknowledged' or the error."""
    p = AsyncProducer("pg", address, request_timeout=1)
    try:
        await p.send(Message("T", b"x"))
        return "acknowledged"
    except ClientError as e:
        return f"refused: {e}"
    finally:
        await p.close()


def test_a_restarted_sync_master_acknowledges_no_write_before_it_leads(tmp_path, monkeypatch):
    async def go():
        first = Broker(config(tmp_path))
        await first.start()           # a new master: epoch 1
        await first.stop()

        seen: list[str] = []
        real_site_start = web.TCPSite.start
        broker: Broker | None = None

        async def site_start(site):
            # a step of startup: a producer that reconnects in a tight loop is already at the door
            seen.append(await try_send(broker.data_address))
            await real_site_start(site)
        monkeypatch.setattr(web.TCPSite, "start", site_start)

        broker = Broker(config(tmp_path))
        await broker.start()
        try:
            monkeypatch.setattr(web.TCPSite, "start", real_site_start)
            assert broker.role.is_master
            after = await try_send(broker.data_address)
        finally:
            await broker.stop()
        return seen, after

    seen, after = asyncio.run(go())
    assert len(seen) == 1 and seen[0] != "acknowledged", \
        "a send in the moment the data port opened was acknowledged with no slave holding it"
    # refused: SYNC replication has no slave yet, and a restarted master is on probation until one shows its log whole
    assert after.startswith("refused") and "lost nothing" in after, after


def test_a_promoted_sync_slave_acknowledges_no_write_before_it_leads(tmp_path, monkeypatch):
    async def go():
        broker = Broker(config(tmp_path, role="slave", master="127.0.0.1:9"))   # its master is gone
        await broker.start()
        seen: list[str] = []
        state = broker.state
        real_append = state.append

        def append(record):
            lsn, written = real_append(record)
            if type(record) is not EpochRecord:
                return lsn, written

            async def with_a_send_meanwhile():
                # while the new epoch is being written, a producer already sends to this broker
                seen.append(await try_send(broker.data_address))
                return await written
            return lsn, asyncio.ensure_future(with_a_send_meanwhile())
        monkeypatch.setattr(state, "append", append)
        try:
            await broker.roles.promote(broker.state.epoch + 1)
            monkeypatch.setattr(state, "append", real_append)
            assert broker.role.is_master
        finally:
            await broker.stop()
        return seen

    seen = asyncio.run(go())
    assert len(seen) == 1 and seen[0] != "acknowledged", \
        "a send while the promotion's epoch was being written was acknowledged with no slave holding it"


def test_a_confirmed_master_still_on_probation_takes_no_write(tmp_path):
    """Under ASYNC flush a restarted master is on probation until a slave shows it lost nothing; its
    controller's confirmation ends only the wait for the controller, not that."""
    async def go():
        cfg = dict(flush_disk_type="ASYNC", await_role_confirmation=True)
        first = Broker(config(tmp_path, **cfg))
        await first.start()           # a new master: epoch 1, no confirmation needed
        assert not first.role.on_hold
        await first.stop()
        broker = Broker(config(tmp_path, **cfg))
        await broker.start()
        try:
            before = broker.role.unconfirmed, broker.role.probation
            broker.roles.confirm(1)
            after = broker.role.unconfirmed, await try_send(broker.data_address)
        finally:
            await broker.stop()
        return before, after

    (unconfirmed, probation), (still_unconfirmed, send) = asyncio.run(go())
    assert "confirms" in unconfirmed and "power cut" in probation
    assert still_unconfirmed == ""
    assert send.startswith("refused") and "power cut" in send, send


def test_a_restarted_sync_flush_master_appends_nothing_before_a_slave_shows_its_log_whole(tmp_path):
    """The fault harness, seed 450: under SYNC flush too a master's log can come back shorter than
    its slave's (a damaged write-ahead log cut short recovers as a crash's would). Confirmed by its
    controller, the restarted master appended new records at offsets its slave held under the same
    epoch: two histories under one epoch, and a reader saw a consumer offset from the one that then
    vanished. Under SYNC replication a restarted master appends nothing until a slave has shown it
    is not ahead (then a slave ahead makes it step down)."""
    async def go():
        cfg = dict(await_role_confirmation=True)  # SYNC flush, SYNC replication
        first = Broker(config(tmp_path, **cfg))
        await first.start()
        await first.stop()
        broker = Broker(config(tmp_path, **cfg))
        await broker.start()
        try:
            broker.roles.confirm(1)
            before = broker.state.next_lsn
            send = await try_send(broker.data_address)
            return send, before, broker.state.next_lsn
        finally:
            await broker.stop()

    send, before, after = asyncio.run(go())
    assert after == before, f"records {before}..{after - 1} appended before any slave showed this log whole"
    assert send.startswith("refused") and "lost nothing" in send, send


def test_a_slave_subscribing_while_its_master_starts_ends_the_probation(tmp_path, monkeypatch):
    """The fault harness, seed 509: a group cut off power as a whole came back with its slave
    subscribing a millisecond after the master's data port opened, before the master had put itself
    on probation. The subscription found no probation to end, and the master then began one that
    nothing ended: it refused every write for good. A master decides its hold before it answers
    anything."""
    async def go():
        first = Broker(config(tmp_path))
        await first.start()           # a new master: epoch 1
        await first.stop()

        real_site_start = web.TCPSite.start
        broker: Broker | None = None
        slave: list[Broker] = []

        async def site_start(site):
            # a step of startup after the data port opened: the slave is back and subscribes now
            s = Broker(config(tmp_path, data_dir=str(tmp_path / "slave"), role="slave", master=broker.data_address,
                              admin_listen="127.0.0.1:0"))
            slave.append(s)
            monkeypatch.setattr(web.TCPSite, "start", real_site_start)
            await s.start()
            for _ in range(500):
                if broker.leader.feeds:
                    break
                await asyncio.sleep(0.01)
            monkeypatch.setattr(web.TCPSite, "start", site_start)
            await real_site_start(site)
        monkeypatch.setattr(web.TCPSite, "start", site_start)

        broker = Broker(config(tmp_path))
        await broker.start()
        monkeypatch.setattr(web.TCPSite, "start", real_site_start)
        try:
            subscribed = bool(broker.leader.feeds)
            probation = broker.role.probation
            send = await try_send(broker.data_address)
        finally:
            for b in (*slave, broker):
                await b.stop()
        return subscribed, probation, send

    subscribed, probation, send = asyncio.run(go())
    assert subscribed, "the slave did not subscribe while its master started"
    assert probation == "", f"the master stays on probation with its slave subscribed: {probation}"
    assert send == "acknowledged", send


def test_a_new_master_whose_first_start_failed_is_still_new(tmp_path):
    """Found by a review of 201a549: settling the role before the ports opened wrote a new master's
    epoch record before binding, so a first start that found its port taken left a store that the
    next start took for a restarted master (on probation, awaiting its controller) though it had
    never taken a write or had a slave."""
    async def go():
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        try:
            failed = Broker(config(tmp_path, listen=f"127.0.0.1:{busy.getsockname()[1]}", await_role_confirmation=True))
            with pytest.raises(OSError):
                await failed.start()
            await failed.stop()
            await failed.state.close()  # (the process would exit here)
        finally:
            busy.close()
        broker = Broker(config(tmp_path, await_role_confirmation=True))
        await broker.start()
        try:
            return broker.role.epoch, broker.role.on_hold
        finally:
            await broker.stop()

    epoch, hold = asyncio.run(go())
    assert (epoch, hold) == (1, ""), f"a new master held as if restarted: {hold}"
