"""A job's deadline against a broker's wall clock set back (the fault harness, seed 274 run again
at 484f778: a job opened while its home master's clock was 120 s ahead stayed open 120 s past its
deadline once the clock was right, past the schedule's settling). On a real broker whose clock
libfaketime moves (`chaos/setup.sh`, run by `make test`, installs it): a job stamped by a clock ahead
of the broker's now is aborted its timeout after the broker first sees that, not once the clock
has caught up with the stamp."""

from __future__ import annotations

import time

import pytest

from support.faketime import needs_faketime, skewable_broker
from support.waiting import wait_until
from txbroker.client import JobCoordinator
from txbroker.client.admin import AdminClient

TIMEOUT_S = 2.0
AHEAD_S = 120

pytestmark = needs_faketime


@pytest.fixture
def skewable(tmp_path):
    """A broker whose wall clock is the offset in `clock`."""
    with skewable_broker(tmp_path, []) as (b, clock):
        yield b, clock


def test_a_job_opened_under_a_clock_since_set_back_is_aborted_its_timeout_later(skewable):
    b, clock = skewable
    admin = AdminClient(b.admin_url)
    with JobCoordinator("skewed", b.address) as jobs:
        def broker_clock(ahead: bool) -> bool:
            """Whether the broker's clock is 120 s ahead (or right), read from a probe job's open stamp."""
            probe = jobs.open(timeout=600).job_id
            skew = admin.job(probe).open_ms / 1000 - time.time()
            jobs.abort(probe)
            return skew > AHEAD_S / 2 if ahead else abs(skew) < 10

        clock.write_text(f"+{AHEAD_S}\n")
        wait_until(lambda: broker_clock(ahead=True), 10, what="the broker's clock 120 s ahead")
        late = jobs.open(timeout=TIMEOUT_S).job_id
        prepared = jobs.open(timeout=600, prepared_timeout=TIMEOUT_S).job_id   # its prepared bound, stamped ahead
        assert jobs.prepare(prepared, []).state == "PREPARED"
        clock.write_text("+0\n")
        wait_until(lambda: broker_clock(ahead=False), 10, what="the broker's clock right again")
        # its deadline is now 120 s ahead of the broker's clock: it goes its 2 s timeout after the
        # broker sees that (a deadline pass every 0.25 s), not once the clock has reached it
        for job_id in (late, prepared):
            wait_until(lambda: admin.job(job_id).state == "ABORTED", 30, what=f"{job_id} aborted at its bound")
            assert admin.job(job_id).by == "deadline"
