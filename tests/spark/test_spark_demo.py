"""The demo end to end (`python -m txbroker_spark.demo`): broker, checker, the orders job with an
injected task crash, and the consumer's verification table."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("pyspark.sql.datasource")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_shows_every_event_exactly_once(tmp_path):
    r = subprocess.run([sys.executable, "-m", "txbroker_spark.demo", "--orders", "600", "--workdir",
                        str(tmp_path / "demo")], capture_output=True, text=True, timeout=540)
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-4000:]
    assert "RESULT: every event arrived exactly once, none from the failed attempt" in out
    table = {line[:52].strip(): line[52:].split() for line in out.splitlines() if line.endswith(("yes", "NO"))}
    assert table["events received by the consumer"][:2] == ["600", "600"]
    assert table["orders received more than once"][:2] == ["0", "0"]
    failed = next(v for k, v in table.items() if k.startswith("events from the failed attempt"))
    assert failed[:2] == ["0", "0"]
    rolled_back = table["failed attempt's transactions rolled back"]
    assert int(rolled_back[0]) >= 1 and rolled_back[0] == rolled_back[1]
    assert (tmp_path / "demo" / "result").is_dir()
