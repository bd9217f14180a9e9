"""Deferred commit: the application runs its own local transaction between the half messages and
the decision (RocketMQ's pattern with Spark in the middle).

    job = new_job_id("orders")
    events.write.format("txbroker").option("commit", "deferred").option("jobId", job)...save()
    d = DeferredJob(ledger, brokers, group, job)      # the half messages are stored, invisible
                                                      # (a secured broker: security=parse_security(options))
    ... the local transaction (e.g. write a dataset) ...
    d.decide(commit=True)                             # the commit point: the ledger's decision
    ... make the local transaction's result visible (idempotent, may be redone after a crash) ...
    d.publish()                                       # the ENDs (check-back would do it too)

If the application dies before `decide`, the checker rolls the job back once its driver is known
dead or its deadline passes; after `decide`, the checker commits it.
"""

from __future__ import annotations

from dataclasses import dataclass

from txbroker.protocol.codes import TransactionState

from txbroker_spark.ledger import ABORTED, COMMITTED, Decision, Ledger
from txbroker_spark.publisher import EndReport, end_all
from txbroker_spark.security import BrokerSecurity


class JobAborted(RuntimeError):
    """The job was decided ABORTED (by the checker, past its deadline) before the application's commit."""


@dataclass
class DeferredJob:
    ledger_dir: str
    brokers: str | list[str]
    group: str
    job: str
    request_timeout: float = 30.0
    security: BrokerSecurity | None = None  # credentials and TLS, as the write's (None: none)

    def __post_init__(self):
        self.ledger = Ledger(self.ledger_dir)
        self.security = self.security or BrokerSecurity()
        self.decision: Decision | None = None

    def prepared(self) -> dict:
        doc = self.ledger.prepared(self.job)
        if doc is None:
            raise RuntimeError(f"job {self.job} has no prepared transactions in {self.ledger.root}: its write did "
                               "not finish (or did not use commit=deferred)")
        return doc

    @property
    def txids(self) -> list[str]:
        return list(self.prepared()["txids"])

    @property
    def rows(self) -> int:
        return int(self.prepared()["rows"])

    def decide(self, commit: bool, reason: str = "") -> Decision:
        """Record the job's decision (first writer wins). Raises JobAborted if a commit lost."""
        if commit:
            prep = self.prepared()
            d = self.ledger.decide_job(self.job, Decision(COMMITTED, list(prep["txids"]), reason=reason,
                                                          by="application", rows=int(prep["rows"]),
                                                          duplicates=int(prep.get("duplicates", 0)),
                                                          attempts=list(prep.get("attempts", []))))
            self.decision = d
            if not d.committed:
                self._ends(self.txids, TransactionState.ROLLBACK)
                raise JobAborted(f"job {self.job} was {d.decision} by {d.by} ({d.reason}) before the application "
                                 "committed it")
            return d
        d = self.ledger.decide_job(self.job, Decision(ABORTED, [], reason=reason or "the application aborted",
                                                      by="application"))
        self.decision = d
        return d

    def publish(self) -> EndReport:
        """Send the ENDs for the recorded decision (idempotent; safe to repeat after a crash)."""
        d = self.decision or self.ledger.job_decision(self.job)
        if d is None:
            raise RuntimeError(f"job {self.job} has no decision yet: call decide() first")
        if d.committed:
            return self._ends(d.txids, TransactionState.COMMIT)
        prep = self.ledger.prepared(self.job)
        return self._ends(prep["txids"] if prep else [], TransactionState.ROLLBACK)

    def _ends(self, txids, state: TransactionState) -> EndReport:
        return end_all(self.brokers, self.group, txids, state, request_timeout=self.request_timeout,
                       security=self.security)
