"""The harness's own parts that two of its anomalies came from: its check-back answer (seeds 39
and 40 of the grown batch: spanning transactions torn by the harness answering COMMIT for a
transaction whose local transaction never ran) and its brokers' check budget (seed 46: transactions
parked because 15 checks of 0.5 s ran out during one fault and the failover after it)."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chaos import broker, checker, workload  # noqa: E402
from chaos.workload import Decisions, History, Tx  # noqa: E402
from txbroker.client import ClientError, LocalTransactionState as S  # noqa: E402


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


class _Refused(ClientError):
    pass


def test_members_of_a_job_its_coordinator_gave_up_on_are_recorded_rolled_back():
    """A member's send raised: the coordinator goes on to another job and never decides this one, so
    its deadline aborts it and no member may ever be read. Recorded as meant to COMMIT (the intent
    before the send), a member read later was neither phantom nor lost: issue 30's "a read of a
    member that was never committed" could not fire (an audit of the checker)."""
    h, stop = History(), threading.Event()

    class Coordinator:
        sent = 0

        async def start(self):
            return self

        async def open(self, timeout):
            return SimpleNamespace(job_id="job.g0.e1.5", home="g0", all_groups=["g0", "g1"])

        async def send(self, job, group, msg, txid, properties=None):
            self.sent += 1
            if self.sent == 2:
                stop.set()
                raise _Refused("refused")

    asyncio.run(workload._coordinator(Coordinator(), h, stop, seed=1))
    assert {k: tx.intended for k, tx in h.txs.items()} == {"job.g0.e1.5-m0": "ROLLBACK", "job.g0.e1.5-m1": "ROLLBACK"}
    got = checker.check(h, SimpleNamespace(bodies=lambda topic: {"job1.0": [("g0", 0, 3)]} if topic == "Orders" else {},
                                           queues_groups=lambda: ["g0", "g1"], skipped={}, rewritten=[], went_back=[],
                                           stuck=[], member_jobs={"job1.0": {"job.g0.e1.5"}}, key_lost=[],
                                           key_phantom=[]),
                        {}, {})
    assert [x.split(":")[0] for x in got["phantom"]] == ["job.g0.e1.5-m0 (member on g0)"]


def test_a_transaction_whose_local_transaction_never_ran_is_recorded_rolled_back(monkeypatch):
    """Its send raised before the local transaction ran: every check-back answers ROLLBACK (Decisions),
    so it must never be read; recorded as meant to COMMIT, a read of it was not a phantom."""
    stop, done = threading.Event(), threading.Event()
    done.set()

    class Producer:
        def __init__(self, group, bootstrap, listener, **kw):
            self.listener, self.calls = listener, 0

        async def start(self):
            return self

        async def send_message_in_transaction(self, msgs, arg, **kw):
            self.calls += 1
            meant[arg[0]] = arg[1].intended
            if self.calls == 2:   # the second time, the local transaction runs, then the send fails
                self.listener.execute_local_transaction(msgs, arg)
                stop.set()
            raise _Refused("a participant refused")

        async def close(self):
            pass

    meant: dict[str, str] = {}
    monkeypatch.setattr(workload, "AsyncClusterTransactionProducer", Producer)
    h = History()
    asyncio.run(workload._producer(["127.0.0.1:1"], h, stop, 0, 2, done))
    assert meant["t0-1"] == "COMMIT"                 # (the seed's draw: else this test shows nothing)
    assert h.txs["t0-1"].intended == "ROLLBACK"      # never ran: rolled back by every check-back
    assert h.txs["t0-2"].intended == meant["t0-2"]   # ran: as it was meant


def test_every_job_its_home_still_holds_is_asked_at_the_end_and_a_silent_home_only_once():
    """The checker's "decision changed" judges what the homes answered; sampling only the 6 newest
    jobs saw a decision only in its first seconds (an audit). A home that does not answer is not
    asked about each of its jobs in turn (each would wait out the request timeout)."""
    h = History()
    asked = []

    class Home:
        def __init__(self, name, answers):
            self.name, self.answers = name, answers

        async def describe(self, job_id):
            asked.append(job_id)
            if not self.answers:
                raise _Refused("no answer")
            return SimpleNamespace(state="COMMITTED")

    coordinator = SimpleNamespace(groups=SimpleNamespace(members={"g0": Home("g0", True), "g1": Home("g1", False)}))
    jobs = [(f"job.g0.e1.{i}", "g0") for i in range(20)] + [(f"job.g1.e1.{i}", "g1") for i in range(5)]
    asyncio.run(workload._decisions_of(jobs, coordinator, h))
    assert [j for _t, j, s in h.decisions] == [j for j, home in jobs if home == "g0"]
    assert asked.count("job.g1.e1.0") == 1 and not any(j.startswith("job.g1.e1.1") for j in asked)


def test_two_threads_writing_one_state_file_at_once_both_succeed(tmp_path):
    """The fault harness, seed 311: the kubelet loop and an added group's start wrote one pods file at
    once through the same temporary file; one os.replace found it gone and the schedule died."""
    from chaos.controller import read_state, write_state

    path, failures = tmp_path / "g2.pods.json", []

    def writer(k):
        try:
            for i in range(300):
                write_state(path, {"writer": k, "i": i})
        except OSError as e:
            failures.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and read_state(path)["i"] == 299
