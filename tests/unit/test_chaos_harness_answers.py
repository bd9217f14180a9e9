"""The harness's own parts that two of its anomalies came from: its check-back answer (seeds 39
and 40 of the grown batch: spanning transactions torn by the harness answering COMMIT for a
transaction whose local transaction never ran) and its brokers' check budget (seed 46: transactions
parked because 15 checks of 0.5 s ran out during one fault and the failover after it)."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos import broker  # noqa: E402
from chaos.workload import Decisions, History, Tx  # noqa: E402
from txbroker.client import LocalTransactionState as S  # noqa: E402


def test_a_check_back_of_a_transaction_whose_local_transaction_never_ran_is_rolled_back():
    h = History()
    d = Decisions(h, random.Random(1))
    # the send raised before the local transaction ran (a participant refused): the history has it
    h.add("t0-39", Tx(["t0-39.0", "t0-39.1"], "COMMIT", groups=["g0", "g1"]))
    assert d.check_local_transaction(SimpleNamespace(transaction_id="t0-39")) == S.ROLLBACK
    d.execute_local_transaction(None, ("t0-40", Tx(["t0-40.0"], "COMMIT")))
    assert d.check_local_transaction(SimpleNamespace(transaction_id="t0-40")) == S.COMMIT
    d.execute_local_transaction(None, ("t0-41", Tx(["t0-41.0"], "ROLLBACK")))
    assert d.check_local_transaction(SimpleNamespace(transaction_id="t0-41")) == S.ROLLBACK


def test_the_check_budget_outlasts_the_longest_fault_hold_and_a_failover():
    flags = dict(zip(broker.FLAGS[::2], broker.FLAGS[1::2]))
    budget_s = int(flags["--check-max"]) * int(flags["--check-interval-ms"]) / 1000
    longest_hold_s, failover_s = 6.0, 6.0  # schedule.py holds a fault 1-6 s; a kill's back-off is 3-6 s
    assert budget_s > longest_hold_s + failover_s, budget_s  # at 15 checks (seed 46): 7.5 s
