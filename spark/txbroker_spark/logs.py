"""The package's log, on stderr of whichever process runs it: the driver's Python worker at
planning and commit, an executor's Python worker in a task (Spark starts those without logging)."""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("txbroker_spark")


def setup_logging() -> None:
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(asctime)s txbroker-spark %(levelname)s %(message)s"))
        log.addHandler(h)
        log.setLevel(os.environ.get("TXBROKER_SPARK_LOG", "INFO").upper())
        log.propagate = False
