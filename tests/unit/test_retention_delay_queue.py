"""Retention by age keeps the delay queue's undelivered retries, on a real store: also when the entry
at a level's delivered offset is already gone (deleted before the rule existed, or cut by a
truncation), the next stored one holds the cutoff (a reviewer's finding: reading only the cursor's
entry left such a level unprotected for good)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from txbroker.broker.retention_service import RetentionService
from txbroker.broker.schedule_service import SCHEDULE_GROUP
from txbroker.protocol.bodies import Message
from txbroker.protocol.names import PROPERTY_DELIVER_MS, PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC
from txbroker.store import retention
from txbroker.store.boot_clock import BootClock
from txbroker.store.reads import MessageReader
from txbroker.store.records import OffsetRecord
from txbroker.store.state import StateMachine


def retry(i: int) -> Message:
    return Message(SCHEDULE_TOPIC, b"r%d" % i, queue_id=0,
                   properties={PROPERTY_REAL_TOPIC: "%RETRY%cg", PROPERTY_DELIVER_MS: str(10 ** 13)})


def test_the_first_stored_retry_past_the_delivered_offset_holds_retention_by_age(tmp_path):
    async def main():
        state = StateMachine(str(tmp_path / "store"), False, lambda e: None)
        try:
            lsns = []
            for i in range(6):
                lsns.append(state.append_messages(1, [retry(i)])[0])
                state.append_messages(1, [Message("Other", b"x", queue_id=0)])
            state.append(OffsetRecord(SCHEDULE_GROUP, [(SCHEDULE_TOPIC, 0, 0)]))  # nothing delivered
            await state.drain()
            broker = SimpleNamespace(state=state, reader=MessageReader(state),
                                     schedule=SimpleNamespace(levels_ms=[3_000]),
                                     config=SimpleNamespace(retention_ms=1_000, retention_bytes=0,
                                                            retention_check_interval_ms=100))
            service = RetentionService(broker)
            assert service._first_undelivered_retry() == lsns[0]
            # retries 0 and 1 deleted anyway (a store from before the rule): the cursor's entry is gone
            mark = state.marks.take(2, lsns[2], 0, state.lineage(), BootClock())
            await retention.delete_before(state, mark, 2)
            assert state.committed_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, 0, published=False) == 0
            assert state.queue_start(SCHEDULE_TOPIC, 0) == 2
            assert service._first_undelivered_retry() == lsns[2]
        finally:
            await state.close()
    asyncio.run(main())
