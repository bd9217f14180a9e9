"""The transaction service: prepare (half messages), commit, rollback, park and resume.

Every decision is validated against memory (pending transactions) and the finished-transaction
index, then recorded as one log record. END_TRANSACTION is idempotent: a duplicate of the decision
already taken answers SUCCESS with `already`, the opposite decision a clear refusal; neither changes
anything (invariant I3).
"""

from __future__ import annotations

import time

from txbroker.broker.metrics import BrokerMetrics
from txbroker.broker.replies import Reply, RequestError, error, ok
from txbroker.broker.role import RoleState
from txbroker.broker.transaction.settings import SettingsBook
from txbroker.broker.topics import TopicRegistry
from txbroker.protocol.bodies import EndTransactionRequest, EndTransactionResponse, SendRequest, SendResponse
from txbroker.protocol.codes import ResponseCode, TransactionState
from txbroker.protocol.properties import PropertyError, check_admissible
from txbroker.store import keys
from txbroker.store.records import (
    COMMITTED, JOB_COMMITTED, JOB_OPEN, PARKED, PREPARED, EndRecord, FinishedTx, HalfRecord, ParkRecord, PendingTx,
    ResumeRecord,
)
from txbroker.protocol.names import TRANS_CHECK_MAX_TIME_TOPIC
from txbroker.store.state import StateMachine

MAX_TRANSACTION_ID = 128
_STATES = {s.value: s for s in TransactionState}


def now_ms() -> int:
    return int(time.time() * 1000)


async def _after(written, reply: Reply) -> Reply:
    await written
    return reply


class TransactionService:
    def __init__(self, state: StateMachine, topics: TopicRegistry, role: RoleState, metrics: BrokerMetrics,
                 settings: SettingsBook, reject_transaction_message: bool = False, cluster=None):
        self._state = state
        self._cluster = cluster  # broker/cluster.py: where a participant's home group is
        # a participant's END, asked of its home group (participants.py sets it): a coroutine
        self.participant_end = None
        self._settings = settings  # a group may require its transactions to join a job
        self._topics = topics
        self._role = role
        self._metrics = metrics
        self.reject_transaction_message = reject_transaction_message

    # ---- prepare -----------------------------------------------------------------------------

    def prepare(self, req: SendRequest) -> Reply:
        if self.reject_transaction_message:
            return error(ResponseCode.NO_PERMISSION, "this broker rejects transactional messages (reject_transaction_message)")
        self._role.require_master()
        txid = req.transaction_id
        if len(txid) > MAX_TRANSACTION_ID:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"transaction id longer than {MAX_TRANSACTION_ID} characters")
        if not req.producer_group:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "a transactional send needs a producer group")
        existing = self._state.pending_transaction(txid) or self._state.finished(txid)
        if existing is not None:  # a retried half send: answer what was stored, store nothing
            return self._duplicate_prepare(req, existing)
        if self._cluster is not None and self._cluster.draining:  # a draining group takes no new messages
            self._cluster.refuse_draining()
        if req.home or req.participants:
            self._check_spanning(req)
        elif req.job_id:
            self._check_job_open(req)
        elif self._settings.for_group(req.producer_group).require_job:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"producer group {req.producer_group!r} requires every transaction to join a "
                               "coordinated transaction (require_job; TxProducerGroup checkMode ledger): open a job "
                               "and send with its id")
        if req.messages:  # refused before anything is written (a topic either): the store parses these
            try:
                check_admissible({**req.properties, **req.messages[0].properties})
            except PropertyError as e:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"transaction {txid}: {e}") from None
        self._topics.validate_for_send(req.messages)
        lsn, durable = self._state.append(HalfRecord(txid, req.producer_group, now_ms(), req.messages, req.job_id,
                                                     req.home, list(dict.fromkeys(req.participants)),
                                                     req.properties))
        self._metrics.sent_half.inc(len(req.messages))
        self._metrics.group_sent_half(req.producer_group).inc(len(req.messages))
        return ok(SendResponse(
            msg_ids=keys.msg_ids(lsn, len(req.messages)),
            queue_ids=[m.queue_id for m in req.messages],
            transaction_id=txid, commit_log_offset=lsn), durable)

    def _check_spanning(self, req: SendRequest) -> None:
        """A half message of a transaction spanning groups: a participant names its home, the home
        names the groups of its participants; never both, and never in a job."""
        txid = req.transaction_id
        if req.home and req.participants:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"transaction {txid}: a half message names either its "
                               "home group (a participant) or its participants' groups (the home), not both")
        if req.job_id:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"transaction {txid}: a transaction spanning broker "
                               f"groups cannot also join job {req.job_id[:128]}")
        if self._cluster is None:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "this broker belongs to no cluster of broker groups")
        if req.home:
            self._cluster.check_home(req.home)
            self._cluster.refuse_if_home_leaving(req.home, f"transaction {txid}")
        for group in req.participants:
            self._cluster.check_other_group(group, "participant")

    def _check_job_open(self, req: SendRequest) -> None:
        """A member may join only an open job of its own group, before the deadline."""
        j = self._state.job(req.job_id)
        if j is None:
            raise RequestError(ResponseCode.QUERY_NOT_FOUND, f"no job {req.job_id!r} on this broker (OPEN_JOB first)")
        if j.producer_group != req.producer_group:
            raise RequestError(ResponseCode.TRANSACTION_STATE_GROUP_WRONG,
                               f"job {j.job_id} belongs to producer group {j.producer_group!r}, "
                               f"not {req.producer_group!r}")
        if j.state != JOB_OPEN:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION, f"job {j.job_id} is {j.state}: it takes no new members")
        if not j.home and now_ms() >= j.deadline_ms:  # (a member group's entry: its home keeps the deadline)
            raise RequestError(ResponseCode.ILLEGAL_OPERATION,
                               f"job {j.job_id} passed its deadline; it is being aborted")
        if j.home and self._cluster is not None:
            self._cluster.refuse_if_home_leaving(j.home, f"job {j.job_id}")

    def _duplicate_prepare(self, req: SendRequest, existing: PendingTx | FinishedTx) -> Reply:
        if existing.producer_group != req.producer_group:
            return error(ResponseCode.TRANSACTION_STATE_GROUP_WRONG,
                         f"transaction {req.transaction_id} belongs to producer group {existing.producer_group!r}, "
                         f"not {req.producer_group!r}")
        if existing.job_id != req.job_id:
            return error(ResponseCode.ILLEGAL_OPERATION,
                         f"transaction {req.transaction_id} was sent as a member of job {existing.job_id or '(none)'!r}, "
                         f"not {req.job_id or '(none)'!r}")
        if isinstance(existing, PendingTx) and existing.home != req.home:
            return error(ResponseCode.ILLEGAL_OPERATION,
                         f"transaction {req.transaction_id} was sent here with home group {existing.home or '(none)'!r}, "
                         f"not {req.home or '(none)'!r}")
        lsn = existing.half_lsn
        n = existing.message_count
        # Acknowledged only as the first send would have been: once the half message is published.
        return ok(SendResponse(msg_ids=keys.msg_ids(lsn, n), transaction_id=req.transaction_id,
                               commit_log_offset=lsn, duplicate=True), self._state.published_future(lsn))

    # ---- end ---------------------------------------------------------------------------------

    def end(self, req: EndTransactionRequest, by: str = "producer", force: bool = False) -> Reply:
        """Commit or roll back (or, for UNKNOWN, leave as is). `by` is producer, check or admin; an
        administrator ends a participant against its home only with `force`."""
        if by == "check":  # a check-back's answer (producer connection or webhook), counted by what it said
            self._metrics.checkback_answers.get(req.state, self._metrics.checkback_answer_invalid).inc()
        self._role.require_master()
        wanted = _STATES.get(req.state)  # (the enum's own lookup by value is a Python call chain)
        if wanted is None:
            return error(ResponseCode.MESSAGE_ILLEGAL, f"unknown transaction state {req.state}: use 0 UNKNOWN, 1 COMMIT, 2 ROLLBACK")
        txid = req.transaction_id
        p = self._state.pending_transaction(txid)
        if p is None:
            return self._end_finished(req, wanted)
        if by != "admin" and req.producer_group != p.producer_group:
            return error(ResponseCode.TRANSACTION_STATE_GROUP_WRONG,
                         f"transaction {txid} belongs to producer group {p.producer_group!r}, not {req.producer_group!r}")
        if req.commit_log_offset and req.commit_log_offset != p.half_lsn:
            return error(ResponseCode.ILLEGAL_OPERATION,
                         f"transaction {txid} is stored at offset {p.half_lsn}, not {req.commit_log_offset}")
        if wanted == TransactionState.UNKNOWN:
            return ok(EndTransactionResponse(TransactionState.UNKNOWN))
        if p.home:  # ended only as its home group ended it
            if by != "admin":
                return self.participant_end(p, wanted)
            if not force:
                raise RequestError(ResponseCode.ILLEGAL_OPERATION, f"transaction {txid} is a participant: its home "
                                   f"group {p.home} decides it, and it ends as the home's ends (this broker asks "
                                   f"{p.home}'s master itself). Ending it here by hand tears the transaction unless "
                                   f"{p.home} ends the same way; force it to do so anyway")
        if p.job_id and not (by == "admin" and p.state == PARKED):  # (parked: nobody will decide it but an operator)
            refusal = self._member_end_refusal(p, wanted)
            if refusal is not None:
                return refusal
        offsets, durable = self.finish(p, wanted, by)
        return ok(EndTransactionResponse(wanted, False, offsets), durable)

    def _member_end_refusal(self, p: PendingTx, wanted: TransactionState) -> Reply | None:
        """A member's own END may only agree with its job: before the decision only a rollback of a
        member not yet promised (the job still OPEN), after it only what the decision says."""
        j = self._state.job(p.job_id)
        if j is None or j.state == JOB_OPEN and wanted == TransactionState.ROLLBACK:
            return None
        if not j.decided:
            return error(ResponseCode.ILLEGAL_OPERATION,
                         f"transaction {p.transaction_id} is a member of job {j.job_id} ({j.state}): the job's "
                         "decision ends it (DECIDE_JOB)")
        kept = j.state == JOB_COMMITTED and p.transaction_id in j.members
        if kept == (wanted == TransactionState.COMMIT):
            return None
        code = ResponseCode.TRANSACTION_SHOULD_COMMIT if kept else ResponseCode.TRANSACTION_SHOULD_ROLLBACK
        refusal = error(code, f"transaction {p.transaction_id}: its job {j.job_id} was {j.state} "
                              f"({'keeping' if kept else 'not keeping'} it)")
        unpublished = self._state.published_future(j.decision_lsn)  # named once no failover can take it back
        return refusal if unpublished is None else _after(unpublished, refusal)

    def finish(self, p: PendingTx, wanted: TransactionState, by: str) -> tuple[list[int], object]:
        """Record the end of pending transaction `p`; returns its queue offsets and durability future."""
        txid, half_lsn, now = p.transaction_id, p.half_lsn, now_ms()
        _lsn, offsets, durable = self._state.append_to_queues(
            p.runs if wanted == TransactionState.COMMIT else [],
            lambda offsets: EndRecord(txid, half_lsn, wanted, now, offsets, by))
        if wanted == TransactionState.COMMIT:
            self._metrics.tx_commit.inc()
            self._metrics.group_tx_commit(p.producer_group).inc()
        else:
            self._metrics.tx_rollback.inc()
            self._metrics.group_tx_rollback(p.producer_group).inc()
        return offsets, durable

    def _end_finished(self, req: EndTransactionRequest, wanted: TransactionState) -> Reply:
        txid = req.transaction_id
        f = self._state.finished(txid)
        if f is None:
            return error(ResponseCode.QUERY_NOT_FOUND, f"no transaction {txid!r} on this broker")
        if f.producer_group != req.producer_group and req.producer_group:
            return error(ResponseCode.TRANSACTION_STATE_GROUP_WRONG,
                         f"transaction {txid} belongs to producer group {f.producer_group!r}, not {req.producer_group!r}")
        final = TransactionState.COMMIT if f.state == COMMITTED else TransactionState.ROLLBACK
        if wanted in (final, TransactionState.UNKNOWN):
            self._metrics.tx_duplicate_end.inc()
            return ok(EndTransactionResponse(final, True, f.queue_offsets), self._state.published_future(f.end_lsn))
        if final == TransactionState.COMMIT:
            return error(ResponseCode.TRANSACTION_SHOULD_COMMIT, f"transaction {txid} was already committed; rollback refused")
        return error(ResponseCode.TRANSACTION_SHOULD_ROLLBACK, f"transaction {txid} was already rolled back; commit refused")

    # ---- parking (checkMax reached) and resuming ------------------------------------------------

    def park(self, p: PendingTx, now: int) -> None:
        txid = p.transaction_id
        self._state.append_to_queues([(TRANS_CHECK_MAX_TIME_TOPIC, 0, p.message_count)],
                                     lambda offsets: ParkRecord(txid, now, offsets))
        self._metrics.tx_park.inc()

    def resume(self, txid: str) -> Reply:
        self._role.require_master()
        p = self._state.pending_transaction(txid)
        if p is None:
            f = self._state.finished(txid)
            if f is None:
                return error(ResponseCode.QUERY_NOT_FOUND, f"no transaction {txid!r} on this broker")
            return error(ResponseCode.ILLEGAL_OPERATION, f"transaction {txid} is already {f.state}")
        if p.state != PARKED:
            return error(ResponseCode.ILLEGAL_OPERATION, f"transaction {txid} is {p.state}, not PARKED")
        _lsn, durable = self._state.append(ResumeRecord(txid, now_ms()))
        return ok(None, durable)

    def counts(self) -> tuple[int, int]:
        parked = sum(1 for p in self._state.pending_transactions() if p.state == PARKED)
        return self._state.pending_count - parked, parked


__all__ = ["TransactionService", "now_ms", "PREPARED", "PARKED"]
