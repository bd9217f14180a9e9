"""The demo end to end (`python -m txbroker_spark.demo`): a master+slave broker pair, no checker,
the orders job in local[*,4] with an injected task crash, and the consumer's verification table,
checked as a user reads it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("pyspark.sql.datasource")

ORDERS = 600


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_shows_every_event_exactly_once(tmp_path):
    r = subprocess.run([sys.executable, "-m", "txbroker_spark.demo", "--orders", str(ORDERS), "--workdir",
                        str(tmp_path / "demo")], capture_output=True, text=True, timeout=540)
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-4000:]
    assert "started a local master+slave broker pair" in out and "running the orders job in local[*,4]" in out

    # the job's summary: every order committed, the crashed attempt's transactions counted as rolled back
    (line,) = [ln for ln in out.splitlines() if "SUMMARY " in ln]
    s = dict(kv.split("=", 1) for kv in line.split("SUMMARY ", 1)[1].split())
    assert (s["decision"], s["rows"], s["committed"]) == ("COMMITTED", str(ORDERS), s["transactions"])
    assert int(s["rolled_back"]) >= 1 and s["discarded_attempts"] == "1"

    # the verification table: check -> (expected, actual), every line "yes"
    rows = {m.group(1).strip(): (int(m.group(2)), int(m.group(3)), m.group(4))
            for m in re.finditer(r"^(.{52})\s*(\d+)\s+(\d+)  (yes|NO)$", out, re.M)}
    assert len(rows) == 10 and all(ok == "yes" for _, _, ok in rows.values()), rows
    for check in ("orders in the committed dataset", "events received by the consumer",
                  "distinct orders among the events", "events equal to their dataset row"):
        assert rows[check][:2] == (ORDERS, ORDERS), check
    for check in ("orders received more than once", "events outside the job's committed transactions",
                  "transactions still pending"):
        assert rows[check][:2] == (0, 0), check
    (failed,) = [v for k, v in rows.items() if k.startswith("events from the failed attempt (task ")]
    assert failed[:2] == (0, 0)
    rolled = rows["failed attempt's transactions rolled back"]
    assert rolled[0] == rolled[1] == int(s["rolled_back"])
    assert rows["... of which by the broker, from the job's decision"][:2] == rolled[:2]
    assert f"{ORDERS} rows, {s['transactions']} transactions, {s['committed']} committed, " \
           f"{s['rolled_back']} rolled back" in out
    assert "RESULT: every event arrived exactly once, none from the failed attempt" in out
    assert (tmp_path / "demo" / "result").is_dir()
