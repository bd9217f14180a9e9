"""Retention against a broker's wall clock set back (the fault harness, seed 150), on a real broker
whose clock libfaketime moves (as chaos/broker.py does; `chaos/setup.sh`, run by `make test`,
installs it): records written while the clock was behind are kept their whole retention once it is
right again, and go after it. Before marks were aged by the boot clock, the marks taken while it was
behind were stamped just after the last one before, looked old the moment the clock was right, and
retention deleted those records at once."""

from __future__ import annotations

import time

import pytest

from support.faketime import needs_faketime, skewable_broker
from support.cli import run_cli
from support.waiting import wait_until
from txbroker.client import BrokerError, Message, Producer, PullConsumer

RETENTION_S = 2.0

pytestmark = needs_faketime


@pytest.fixture
def skewable(tmp_path):
    """A broker (2 s retention, a pass every 100 ms) whose wall clock is the offset in `clock`."""
    with skewable_broker(tmp_path, ["--retention-ms", str(int(RETENTION_S * 1000)),
                                    "--retention-check-interval-ms", "100"]) as (b, clock):
        yield b, clock


def broker_clock_behind(p: Producer, c: PullConsumer) -> float:
    """How far the broker's wall clock is behind this process's (s), read from a probe's store time."""
    r = p.send(Message("Probe", b"probe"))
    (m,) = c.pull("Probe", r.queue_ids[0], r.queue_offsets[0], 1).messages
    return time.time() - m.store_timestamp / 1000


def stored(c: PullConsumer, offset: int) -> bool:
    try:
        got = c.pull("Kept", 0, offset, 1).messages
    except BrokerError as e:
        if e.code_name == "PULL_OFFSET_MOVED":
            return False
        raise
    return bool(got) and got[0].queue_offset == offset


def test_records_written_while_the_clock_was_behind_are_kept_their_whole_retention(skewable):
    b, clock = skewable
    for topic in ("Kept", "Probe"):
        run_cli("topic", "create", topic, "--queues", "1", "--admin", b.admin_url)
    with Producer("p", b.address) as p, PullConsumer(b.address) as c:
        p.send(Message("Kept", b"before"))
        clock.write_text("-30\n")  # set back 30 s
        wait_until(lambda: broker_clock_behind(p, c) > 20, 10, what="the broker's clock set back")
        behind_since = time.monotonic()
        # held longer than the retention: retention passes take marks all the while
        time.sleep(RETENTION_S + 1.0)
        assert time.monotonic() - behind_since > RETENTION_S
        sent = time.monotonic()
        offset = p.send(Message("Kept", b"written while behind")).queue_offsets[0]
        p.send(Message("Kept", b"the queue's newest"))  # a queue's newest message is kept anyway
        clock.write_text("+0\n")
        wait_until(lambda: broker_clock_behind(p, c) < 5, 10, what="the broker's clock right again")
        # from now until it is as old as the retention, it is there at every look
        while time.monotonic() - sent < RETENTION_S - 0.2:
            assert stored(c, offset), f"deleted {time.monotonic() - sent:.2f}s after it was sent (retention {RETENTION_S}s)"
        wait_until(lambda: not stored(c, offset), 20, what="retention to delete it once it is old enough")
        assert time.monotonic() - sent >= RETENTION_S
