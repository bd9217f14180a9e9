"""Failure injection for the tests and the demo: the one seam between the write path and the
`inject.*` options (never set in production).

The write path calls two hooks, each at a named point, and nothing else of this module:

    o.faults.after_send(partition, attempt_number, txids)   a task attempt, once its half messages are stored
    o.faults.at_point(point, batch_id, detail)              the driver: "before-open" (a batch write, before it
                                                            opens its job), "before-decision", "after-home-decision"
                                                            (its home recorded it, no other group told yet),
                                                            "after-decision" (every group told)

With no inject.* option set (`FaultPlan()`) both return at once. What they can do:
  failPartition + failMode   the attempt raises (raise; always: every attempt) or its Python worker exits
                             (crash), after sending: Spark retries it, or fails the job (always)
  slowPartition + slowSeconds  attempt 0 sleeps after sending (a straggler for speculation, an executor to kill)
  hangAt (+ hangBatch)       the driver waits at the point until killed, or released by `<markerFile>.release`
  markerFile                 where each hook announces itself: its point, its pid, what it stored
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass

log = logging.getLogger("txbroker_spark")

HANG_POINTS = ("before-open", "before-decision", "after-home-decision", "after-decision")
FAIL_MODES = ("crash", "raise", "always")


@dataclass(frozen=True)
class FaultPlan:
    fail_partition: int | None = None
    fail_mode: str = "crash"  # crash (the Python worker exits) | raise (the task raises) | always (every attempt raises)
    slow_partition: int | None = None
    slow_seconds: float = 0.0
    hang_at: str | None = None  # one of HANG_POINTS
    hang_batch: int | None = None  # streaming: only this micro-batch
    marker_file: str | None = None

    def after_send(self, partition: int, attempt_number: int, txids: list[str]) -> None:
        """A task attempt stored all its half messages; it has not returned its commit message yet."""
        if self.slow_partition == partition and attempt_number == 0 and self.slow_seconds:
            log.warning("inject.slowPartition=%d: attempt 0 sleeps %.1fs after sending", partition, self.slow_seconds)
            # tells a test which process to kill (an executor lost mid-write)
            self._announce({"at": "slow", "pid": os.getpid(), "partition": partition, "txids": txids})
            time.sleep(self.slow_seconds)
        if self.fail_partition != partition or (attempt_number != 0 and self.fail_mode != "always"):
            return
        if self.fail_mode == "crash":
            self._announce({"at": "crash", "pid": os.getpid(), "partition": partition, "txids": txids})
            log.warning("inject.failPartition=%d: attempt %d crashes (its Python worker exits) after sending %d half "
                        "transactions", partition, attempt_number, len(txids))
            sys.stderr.flush()
            os._exit(17)
        raise RuntimeError(f"inject.failPartition={partition}: attempt {attempt_number} fails after sending "
                           f"{len(txids)} half transactions")

    def at_point(self, point: str, batch_id: int | None, detail: dict) -> None:
        """The driver at `point` of its write (batch_id: the micro-batch, None for a batch write):
        announce it, then wait to be killed, or released by a file `<marker>.release` (a driver
        paused and resumed), at most 10 min."""
        if self.hang_at != point or (batch_id is not None and self.hang_batch not in (None, batch_id)):
            return
        self._announce({"at": point, "pid": os.getpid(), **detail})
        release = self.marker_file + ".release" if self.marker_file else None
        log.warning("inject.hangAt=%s: waiting here to be killed or released (%s)", point, detail)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if release and os.path.exists(release):
                log.warning("inject.hangAt=%s: released, going on", point)
                return
            time.sleep(0.2)
        raise RuntimeError(f"inject.hangAt={point}: nobody killed this process within 10 minutes")

    def _announce(self, doc: dict) -> None:
        if not self.marker_file:
            return
        tmp = self.marker_file + ".tmp"  # written whole, then renamed: a test never reads half of it
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.marker_file)
