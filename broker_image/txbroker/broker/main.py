"""Running the broker as a process: logging, the event loop, signals."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from txbroker.broker.auth import CredentialsError
from txbroker.broker.config import BrokerConfig, ConfigError
from txbroker.broker.replication.seed import seed_from_master
from txbroker.broker.server import Broker
from txbroker.broker.tls import BrokerTls, TlsError
from txbroker.store import seed
from txbroker.store.db import StoreCorrupt, StoreError

log = logging.getLogger("txbroker.broker")


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _event_loop_policy() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(config: BrokerConfig) -> int:
    broker = await open_broker(config)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, lambda: (log.info("received SIGINT"), loop.create_task(broker.stop())))
    loop.add_signal_handler(signal.SIGTERM, lambda: (log.info("received SIGTERM"),
                                                     loop.create_task(broker.stop_after_handover())))
    loop.add_signal_handler(signal.SIGHUP, lambda: (log.info("received SIGHUP: reloading credentials and TLS files"),
                                                    broker.reload_security()))
    try:
        await broker.start()
    except OSError as e:
        log.error("cannot listen: %s", e)
        await broker.stop()
        return 2
    await broker.stopped.wait()
    return broker.exit_code


async def open_broker(config: BrokerConfig) -> Broker:
    """The broker on its store: a slave whose store is marked for a seed, or is damaged, is seeded
    from its master first (broker/replication/seed.py)."""
    why = seed.marked(config.data_dir)
    if why is None:
        try:
            return Broker(config)
        except StoreCorrupt as e:
            why = f"its store is damaged ({e})"
    if config.role != "slave" or not config.master:
        raise StoreError(f"data directory {config.data_dir} needs seeding from a master ({why}), but this broker "
                         "starts as a master: start it as a slave of the master (--role slave --master ADDRESS)")
    tls = BrokerTls(config)
    creds = (config.replication_access_key, config.replication_secret()) if config.replication_access_key else None
    await seed_from_master(config, creds, tls.replication, why)
    return Broker(config)


def run(config: BrokerConfig) -> int:
    setup_logging(config.log_level)
    _event_loop_policy()
    try:
        return asyncio.run(serve(config))
    except (StoreError, CredentialsError, TlsError, ConfigError) as e:
        log.error("%s", e)
        return 2
    except OSError as e:  # a seed that could not be fetched (its master unreachable, or refusing)
        log.error("%s: the next start seeds again", e)
        return 3
