"""The store on its own: recovery after close, transaction state, message ids."""

import asyncio

from txbroker.client.producer import as_list
from txbroker.protocol.bodies import Message, encode
from txbroker.protocol.codes import TransactionState
from txbroker.store import keys
from txbroker.store.records import EndRecord, HalfRecord
from txbroker.store.state import StateMachine


def test_close_releases_the_store_and_recovery_sees_everything(tmp_path):
    async def main():
        s = StateMachine(str(tmp_path), True, lambda e: None)
        _, durable = s.append(HalfRecord("t1", "g", 1, [Message("T", b"a", queue_id=0), Message("T", b"b", queue_id=1)]))
        s.append(HalfRecord("t2", "g", 1, [Message("T", b"c", queue_id=0)]))
        offsets = [s.reserve_offsets(keys.queue_prefix("T", q), 1) for q in (0, 1)]
        s.append(EndRecord("t1", 1, TransactionState.COMMIT, 2, offsets))
        await durable
        await s.close()
        again = StateMachine(str(tmp_path), True, lambda e: None)  # same process: the LOCK was released
        assert set(again.pending) == {"t2"}
        assert again.finished("t1").state == "COMMITTED" and again.finished("t1").queue_offsets == [0, 0]
        assert again.next_lsn == 4
        assert again.queue_end("T", 0) == 1 and again.queue_end("T", 1) == 1
        await again.close()

    asyncio.run(main())


def test_message_ids_are_stable_and_parse_back():
    assert keys.msg_ids(0x2A, 3) == [keys.msg_id(0x2A, i) for i in range(3)]
    assert keys.parse_msg_id(keys.msg_id(123456, 7)) == (123456, 7)
    assert len(keys.msg_ids(5, 2000)) == 2000


def test_a_resent_message_does_not_carry_its_old_transaction_id():
    m = Message("T", b"x")
    plain = encode(m)
    m.transaction_id = "abc"  # what a transactional send leaves on the caller's message
    (again,) = as_list(m)
    assert encode(again) == plain
