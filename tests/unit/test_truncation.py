"""Truncation on a real store (issue 23, defect 5): after dropping the records past any LSN, the store
holds exactly what a store that only ever had the kept records holds, in every column family; and
it gets there in one write, so a kill cannot leave it between."""

import asyncio
import random

import pytest

from txbroker.protocol.bodies import Message
from txbroker.protocol.codes import TransactionState
from txbroker.store import keys, retention
from txbroker.store.boot_clock import BootClock
from txbroker.store.db import COLUMN_FAMILIES
from txbroker.store.derived.marks import CLOCK_PREFIX
from txbroker.store.records import (
    CheckRecord, EndRecord, EpochRecord, GroupSettingsRecord, HalfRecord, JobDecisionRecord, JobOpenRecord, JobPrepareRecord,
    OffsetRecord, ParkRecord, ResumeRecord, TopicRecord,
)
from txbroker.protocol.names import TRANS_CHECK_MAX_TIME_TOPIC
from txbroker.store.state import StateMachine

BOOT = BootClock()


def clocked(state) -> set[int]:
    """The stamps of the marks whose boot clock the store holds."""
    return {keys.lsn_from_key(k[len(CLOCK_PREFIX):]) for k, _v in state.db.meta.items(from_key=CLOCK_PREFIX)
            if k.startswith(CLOCK_PREFIX)}


def history(seed: int, s: StateMachine, n: int = 120) -> None:
    """A random mix of every record kind, appended as the broker's services append them."""
    rnd = random.Random(seed)
    s.append(EpochRecord(1, "a", 0))
    for i in range(n):
        step(rnd, s, i)


def step(rnd: random.Random, s: StateMachine, i: int) -> None:
    """One record of a random history (several for some kinds)."""
    pending = list(s.pending_transactions())
    what = rnd.choice(["half", "half", "end", "end", "normal", "check", "park", "resume", "offset", "topic",
                       "epoch", "job", "job", "prepare", "decide", "settings"])
    open_jobs = [j for j in s.jobs.values() if j.state == "OPEN"]
    if what == "half":
        msgs = [Message(rnd.choice("TU"), f"h{i}-{j}".encode(), keys=rnd.choice(["", f"k{i}"]),
                        queue_id=rnd.randrange(2)) for j in range(rnd.randint(1, 3))]
        job = rnd.choice(open_jobs).job_id if open_jobs and rnd.random() < 0.5 else ""
        s.append(HalfRecord(f"tx{i}", "g", i, msgs, job))
    elif what == "job":  # reusing names: a name's newest job moves on
        s.append(JobOpenRecord(f"j{i}", "g", i, i + 1000, rnd.choice(["", "nightly", "hourly"])))
    elif what == "prepare" and open_jobs:
        j = rnd.choice(open_jobs)
        s.append(JobPrepareRecord(j.job_id, sorted(s.job_members.get(j.job_id, ())), i))
    elif what == "decide" and s.jobs:
        j = rnd.choice(list(s.jobs.values()))
        commit = rnd.random() < 0.6
        kept = sorted(s.job_members.get(j.job_id, ()))[:2] if commit else []
        s.append(JobDecisionRecord(j.job_id, TransactionState.COMMIT if commit else TransactionState.ROLLBACK, i,
                                   kept))
    elif what == "end" and pending:
        p = rnd.choice(pending)
        commit = rnd.random() < 0.7
        s.append_to_queues(p.runs if commit else [], lambda offsets: EndRecord(
            p.transaction_id, p.half_lsn, TransactionState.COMMIT if commit else TransactionState.ROLLBACK, i,
            offsets))
    elif what == "normal":
        topic, q = rnd.choice("TU"), rnd.randrange(2)
        msgs = [Message(topic, f"n{i}-{j}".encode(), keys=f"k{i}", queue_id=q) for j in range(rnd.randint(1, 3))]
        s.append_messages(i, msgs, keys.send_back_key("cg", f"m{i}", 0) if rnd.random() < 0.3 else b"")
    elif what == "check" and pending:
        s.append(CheckRecord([p.transaction_id for p in rnd.sample(pending, min(3, len(pending)))], i))
    elif what == "park" and [p for p in pending if p.state == "PREPARED"]:
        p = rnd.choice([p for p in pending if p.state == "PREPARED"])
        s.append_to_queues([(TRANS_CHECK_MAX_TIME_TOPIC, 0, p.message_count)],
                           lambda offsets: ParkRecord(p.transaction_id, i, offsets))
    elif what == "resume" and [p for p in pending if p.state == "PARKED"]:
        s.append(ResumeRecord(rnd.choice([p for p in pending if p.state == "PARKED"]).transaction_id, i))
    elif what == "offset":
        s.append(OffsetRecord(rnd.choice(["cg", "cg2"]), [(rnd.choice("TU"), rnd.randrange(2), rnd.randrange(9))]))
    elif what == "topic":
        s.append(TopicRecord(rnd.choice(["T", "U", f"New{i % 3}"]), rnd.randint(2, 4)))
    elif what == "epoch":
        s.append(EpochRecord(s.epoch + 1, "a", i))
    elif what == "settings":  # a group's settings set, changed, or removed (empty)
        settings = {} if rnd.random() < 0.3 else {"check_interval_ms": rnd.choice([1000, 5000]), "check_max": i}
        s.append(GroupSettingsRecord(rnd.choice(["pg1", "pg2"]), i, settings, rnd.randint(1, 9)))


def contents(s: StateMachine) -> dict:
    db = s.db
    out = {name: dict(getattr(db, name).items()) for name in COLUMN_FAMILIES}
    out["meta"].pop(b"format", None)
    return out


def memory(s: StateMachine) -> dict:
    return {"pending": {p.transaction_id: (p.checks, p.state) for p in s.pending_transactions()}, "topics": dict(s.topics),
            "group_settings": dict(s.group_settings),
            "jobs": {k: (j.state, tuple(j.members)) for k, j in s.jobs.items()},
            "job_members": {k: set(v) for k, v in s.job_members.items() if v or k in s.jobs},
            "epochs": list(s.epochs), "next_lsn": s.next_lsn, "ends": {t: [s.queue_end(t, q) for q in range(2)]
                                                                        for t in ("T", "U")}}


@pytest.mark.parametrize("seed", range(24))
def test_truncation_leaves_what_a_store_of_the_kept_records_holds(tmp_path, seed):
    async def main():
        full = StateMachine(str(tmp_path / "full"), False, lambda e: None)
        history(seed, full)
        await full.drain()
        last_kept = random.Random(seed).randrange(1, full.next_lsn - 1)
        reference = StateMachine(str(tmp_path / "ref"), False, lambda e: None)
        for k, raw in full.db.log.items():
            if keys.lsn_from_key(k) > last_kept:
                break
            reference.apply_replicated(keys.lsn_from_key(k), raw)
        await reference.drain()

        log_end = full.next_lsn - 1
        assert await full.truncate_after(last_kept) == log_end - last_kept
        assert contents(full) == contents(reference)
        assert memory(full) == memory(reference)
        await full.close()
        reopened = StateMachine(str(tmp_path / "full"), False, lambda e: None)
        assert memory(reopened) == memory(reference)
        await reopened.close()
        await reference.close()

    asyncio.run(main())


def test_a_failed_truncation_write_changes_nothing(tmp_path):
    """The one write is the whole truncation: if it does not happen (a kill), the store is as it was."""
    class Killed(Exception):
        pass

    class KilledAtWrite:
        def __init__(self, db):
            self._db = db

        def write(self, *_args):
            raise Killed

        def __getattr__(self, name):
            return getattr(self._db, name)

    async def main():
        s = StateMachine(str(tmp_path), False, lambda e: None)
        history(3, s)
        await s.drain()
        before = contents(s)
        real = s.db.db
        s.db.db = KilledAtWrite(real)
        with pytest.raises(Killed):
            await s.truncate_after(5)
        s.db.db = real
        assert contents(s) == before
        await s.close()

    asyncio.run(main())


def live(s: StateMachine) -> dict:
    """What retention must never change: everything someone may still act on or ask about (pending
    and parked transactions with their lineage, jobs, names, offsets, topics, settings, epochs)."""
    db = s.db
    return {"pending": {p.transaction_id: p for p in s.pending_transactions()},
            "jobs": dict(db.jobs.items()), "offsets": dict(db.offsets.items()),
            "meta": {k: v for k, v in db.meta.items() if k.startswith((b"topic/", b"config/group/", b"epoch/"))},
            "memory": {k: v for k, v in memory(s).items() if k != "ends"}}


@pytest.mark.parametrize("seed", range(24))
def test_truncation_after_retention_leaves_what_a_store_of_the_kept_records_holds(tmp_path, seed):
    """Retention passes between the records (at marks no later than what is published, as the
    broker's limit holds them), then a truncation that cuts only unpublished records (as a rejoin
    under SYNC replication does): every live family equals that of a store that only ever had the
    kept records, and no queue goes back (the second review's defects 4 and 7 lived here)."""
    async def main():
        rnd = random.Random(seed)
        full = StateMachine(str(tmp_path / "full"), False, lambda e: None)
        full.append(EpochRecord(1, "a", 0))
        written: dict[int, bytes] = {}
        published = 0
        for i in range(150):
            step(rnd, full, i)
            if i % 6 == 5:
                await full.drain()
                written.update((keys.lsn_from_key(k), v) for k, v in full.db.log.items())
                published = rnd.randrange(published, full.next_lsn)
                full.marks.take(i, full.next_lsn, full.log_bytes, full.lineage(), BOOT)
                usable = [m for m in full.marks.all() if m.lsn <= published + 1 and m.lsn > full.log_complete_from]
                if usable and rnd.random() < 0.8:
                    await retention.delete_before(full, rnd.choice(usable), i)
        await full.drain()
        written.update((keys.lsn_from_key(k), v) for k, v in full.db.log.items())
        last_kept = rnd.randrange(published, full.next_lsn)
        ends_before = {(t, q): full.queue_end(t, q) for t in ("T", "U") for q in range(2)}
        reference = StateMachine(str(tmp_path / "ref"), False, lambda e: None)
        for lsn in sorted(written):
            if lsn <= last_kept:
                reference.apply_replicated(lsn, written[lsn])
        await reference.drain()

        await full.truncate_after(last_kept)
        assert clocked(full) == {m.ms for m in full.marks.all()}  # each mark's boot clock goes with it
        expected = live(reference)
        assert live(full) == expected
        for (t, q), end in ends_before.items():  # no queue goes back below what was published
            assert full.queue_end(t, q) == reference.queue_end(t, q) <= end
        await full.close()
        await reference.close()
        full = StateMachine(str(tmp_path / "full"), False, lambda e: None)
        assert live(full) == expected
        # the rejoined store goes on (its new master's records), retention with it: every live
        # transaction and job can still be derived from its records (defect 7: a mark taken on the
        # dropped tail let retention delete a half message the cut had made pending again)
        for i in range(150, 200):
            step(rnd, full, i)
            if i % 5 == 4:
                await full.drain()
                full.marks.take(i, full.next_lsn, full.log_bytes, full.lineage(), BOOT)
                usable = [m for m in full.marks.all() if m.lsn > full.log_complete_from]
                if usable:
                    await retention.delete_before(full, rnd.choice(usable), i)
                    assert clocked(full) == {m.ms for m in full.marks.all()}  # dropped marks take theirs
                for p in full.pending_transactions():
                    assert full.db.log.get(keys.lsn_key(p.half_lsn)) is not None, p
                for j in full.jobs.values():
                    assert full.db.log.get(keys.lsn_key(j.open_lsn)) is not None, j
        await full.close()

    asyncio.run(main())
