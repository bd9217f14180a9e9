"""A broker whose stopping fails part way still stops (chaos seed 777: a step of Broker.stop raised
on a full disk, and the process stayed up, answering 503, never restarted)."""

from __future__ import annotations

import asyncio

from txbroker.broker.config import load_config
from txbroker.broker.server import EXIT_STORE_FAILED, Broker


def test_a_step_that_fails_while_stopping_still_ends_in_a_stopped_broker_with_a_failure_exit(tmp_path, caplog):
    async def main():
        b = Broker(load_config(None, {"data_dir": str(tmp_path / "data"), "listen": "127.0.0.1:0",
                                      "admin_listen": "127.0.0.1:0"}))
        await b.start()
        assert b.leader.active

        def disk_full(why):
            raise OSError(28, "No space left on device")

        b.leader.detach = disk_full
        await asyncio.wait_for(b.stop(), 30)
        assert b.stopped.is_set()
        assert b.exit_code == EXIT_STORE_FAILED

    asyncio.run(main())
    assert "stopping broker" in caplog.text and "failed part way" in caplog.text
