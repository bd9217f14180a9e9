"""A store read back whole, in a process of its own (txbroker.store.verify: what a backup runs on its
copy, the broker's loop answering meanwhile): whole, it says how many keys; a damaged table file is
named (the fault harness, seed 571)."""

from __future__ import annotations

import asyncio

import pytest

from txbroker.protocol.bodies import Message
from txbroker.store.db import StoreCorrupt
from txbroker.store.state import StateMachine
from txbroker.store.verify import EXIT_DAMAGED, main, verify_elsewhere


def a_store_with_a_table_file(path) -> None:
    async def fill():
        state = StateMachine(str(path), False, lambda e: None)
        for i in range(500):
            state.append_messages(1, [Message("T", b"m%d-" % i + b"x" * 200, queue_id=0)])
        await state.drain()
        state.db.db.flush()  # the memtables to table files
        await state.close()
    asyncio.run(fill())


def test_a_whole_store_reads_back_and_a_damaged_table_file_is_named(tmp_path, capsys):
    a_store_with_a_table_file(tmp_path / "s")
    assert asyncio.run(verify_elsewhere(str(tmp_path / "s"))) > 500
    table = max((tmp_path / "s").glob("*.sst"), key=lambda p: p.stat().st_size)
    data = bytearray(table.read_bytes())
    at = len(data) // 3
    data[at:at + 32] = bytes(b ^ 0x5A for b in data[at:at + 32])
    table.write_bytes(bytes(data))
    with pytest.raises(StoreCorrupt, match=table.name):
        asyncio.run(verify_elsewhere(str(tmp_path / "s")))
    assert main([str(tmp_path / "s")]) == EXIT_DAMAGED and table.name in capsys.readouterr().err
    assert main([]) == 2 and "usage" in capsys.readouterr().err
