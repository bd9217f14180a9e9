"""QUERY_MESSAGE by key while keys wait to be indexed (broker/processors/consumer.py): the read
waits for the key index, then looks at the broker's role again, since it may have been put on hold
meanwhile (a master on probation answers no read: its log may lack a tail its slaves hold)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from txbroker.broker.auth.acl import OPEN_ACCESS
from txbroker.broker.processors.consumer import QueryByKeyProcessor
from txbroker.broker.replies import RequestError
from txbroker.broker.role import RoleState
from txbroker.protocol.bodies import QueryByKeyRequest, encode
from txbroker.protocol.codes import ResponseCode


def broker_with_keys_waiting(on_index):
    role = RoleState("master", lambda: 1)
    read = []

    async def index_keys_now():
        await asyncio.sleep(0)
        on_index(role)

    state = SimpleNamespace(key_index_lag=lambda: (5, 0), index_keys_now=index_keys_now)
    reader = SimpleNamespace(by_key=lambda topic, key, n: read.append((topic, key)) or [])
    topics = SimpleNamespace(require=lambda topic: 4)
    return SimpleNamespace(role=role, state=state, reader=reader, topics=topics), read


def query(broker):
    conn = SimpleNamespace(access=OPEN_ACCESS)
    reply = QueryByKeyProcessor(broker)(conn, encode(QueryByKeyRequest("T", "k1")))
    assert asyncio.iscoroutine(reply)  # keys wait: answered once they are written
    return asyncio.run(reply)


def test_a_master_put_on_hold_while_keys_were_written_refuses_the_read():
    broker, read = broker_with_keys_waiting(lambda role: setattr(role, "probation", "a slave may hold a newer tail"))
    with pytest.raises(RequestError) as e:
        query(broker)
    assert e.value.code == ResponseCode.SLAVE_NOT_AVAILABLE and "newer tail" in e.value.remark
    assert read == []


def test_a_master_still_serving_answers_once_its_keys_are_written():
    broker, read = broker_with_keys_waiting(lambda role: None)
    assert query(broker).code == ResponseCode.SUCCESS
    assert read == [("T", "k1")]
