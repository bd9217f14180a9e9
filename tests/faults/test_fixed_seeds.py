"""The fault harness (chaos/) on fixed seeds: short schedules of kills, pauses, partitions, clock
skew and full disks against three real brokers failed over by the operator's own decisions, each
history judged by the checker. `make chaos SEEDS=...` runs the long randomized ones.

Seeds 7 and 19 (drawn from the first seven fault kinds, as when they were found) lost acknowledged
commits before the failover made every answering broker follow the successor first: a resumed,
paused master's writes were acknowledged by a slave at the old epoch while the successor led.
Seed 215 read the consumer group's committed offsets ~550 lower after a failover than a moment
before: a SYNC master answered offset queries with commits no slave held yet. Later, in CI, seed 7
delivered a job member whose COMMIT the coordinator had been answered FLUSH_SLAVE_TIMEOUT for (a
BrokerError, read as a refusal), and seed 19 read an offset 10 lower from a master restarted after a
kill -9 (tests/integration/test_jobs.py, test_offsets_published.py hold both).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(600)


def _schedule(tmp_path, seed: int, *extra: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "chaos", "--seeds", str(seed), "--results", str(tmp_path), *extra],
                       cwd=REPO, capture_output=True, text=True, timeout=580)
    report = tmp_path / f"seed-{seed}.json"
    assert report.exists(), f"seed {seed}: no report\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = json.loads(report.read_text())
    assert "error" not in out, out
    return out


def _assert_held(out: dict) -> None:
    assert sum(out["faults"].values()) > 0 and out["commits_acknowledged"] > 0, out["faults"]
    assert out["group"]["consumed"] > 0, out["group"]
    assert out["anomalies"] == {}, (f"seed {out['seed']}: {out['anomalies']}\n"
                                    + json.dumps(out["anomaly_details"], indent=1) + "\nfaults: "
                                    + json.dumps(out["events"]))


@pytest.mark.parametrize("seed", [7, 19])
def test_failover_never_loses_an_acknowledged_commit(tmp_path, seed):
    _assert_held(_schedule(tmp_path, seed, "--kinds", "7"))


def test_clock_skew_and_full_disks_keep_the_invariants(tmp_path):
    out = _schedule(tmp_path, 101, "--duration", "20")
    assert {"fill-master-disk", "skew-slave-clock"} <= set(out["faults"]), out["faults"]
    _assert_held(out)


def test_committed_offsets_never_move_backwards_across_failovers(tmp_path):
    out = _schedule(tmp_path, 215)
    assert {"kill-master", "fill-master-disk"} <= set(out["faults"]) and out["failovers"] >= 2, out["events"]
    assert out["group"]["offset reads"] > 0, out["group"]
    _assert_held(out)
