"""The retention pass: every `retention_check_interval_ms`, on every broker (each deletes its own
old records), take a mark and delete what retention allows (store/retention.py says what is kept).
A master never deletes what a connected slave has not acknowledged; a slave that returns needing
deleted records is refused at subscription, naming what it must do. Nor does retention by age
delete a delayed retry not yet delivered, or anything after it: a retry delayed longer than the
retention (or held up by a failover) is delivered, not lost. Retention by size still may: it bounds
the disk, as Kafka's retention.bytes deletes what nobody consumed yet."""

from __future__ import annotations

import asyncio
import logging
import time

from txbroker.broker.schedule_service import SCHEDULE_GROUP
from txbroker.lifecycle import stop_task
from txbroker.protocol.names import SCHEDULE_TOPIC
from txbroker.store import keys, retention
from txbroker.store.boot_clock import BootClock

log = logging.getLogger(__name__)


class RetentionService:
    def __init__(self, broker):
        self._b = broker
        cfg = broker.config
        self.retention_ms = cfg.retention_ms
        self.retention_bytes = cfg.retention_bytes
        self.interval = cfg.retention_check_interval_ms / 1000
        self._task: asyncio.Task | None = None
        self.newest_mark_lsn = 0  # the next LSN at the newest mark taken
        self.boot = BootClock()  # marks' ages: the time that really passed (store/boot_clock.py)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.run_once()
            except Exception:  # a failed pass is retried at the next; it must not end retention
                log.exception("retention pass failed; trying again in %.0fs", self.interval)

    def _limit(self) -> int:
        """Records from here on stay: unpublished ones, and those a connected slave lacks."""
        state, leader = self._b.state, self._b.leader
        limit = state.durable_lsn + 1
        if leader.active and leader.feeds:
            limit = min(limit, min(f.acked_lsn for f in leader.feeds.values()) + 1)
        return limit

    def _first_undelivered_retry(self) -> int:
        """The LSN of the oldest stored delay-queue entry at or past its level's delivered offset (as
        recorded in the log: a slave's is its master's), or a number past every LSN. Every level's
        queue, also those of levels no longer configured (their entries wait for them to return)."""
        state, reader = self._b.state, self._b.reader
        first = 1 << 63
        for q in range(max(len(self._b.schedule.levels_ms), state.topics.get(SCHEDULE_TOPIC, 0))):
            end = state.queue_end(SCHEDULE_TOPIC, q)
            cursor = state.committed_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, q, published=False) or 0
            offset = max(cursor, state.queue_start(SCHEDULE_TOPIC, q))
            while offset < end:  # the entry at the cursor may be gone (deleted before this rule, or truncated)
                entries, nxt, _ = reader.read_queue(SCHEDULE_TOPIC, q, offset, 1)  # (passes over what is gone)
                if entries:
                    first = min(first, keys.parse_msg_id(entries[0].msg_id)[0])
                    break
                if nxt <= offset:  # nothing readable from here to what is published
                    break
                offset = nxt
        return first

    async def run_once(self) -> int:
        state, metrics = self._b.state, self._b.metrics
        now = int(time.time() * 1000)
        state.marks.take(now, state.next_lsn, state.log_bytes, state.lineage(), self.boot)
        self.newest_mark_lsn = state.next_lsn
        marks = state.marks.all()
        ages = state.marks.ages(marks, now, self.boot)
        mark = retention.choose_cutoff(marks, now, self.retention_ms, self.retention_bytes, state.log_bytes,
                                       self._limit(), ages, age_limit_lsn=self._first_undelivered_retry())
        deleted = 0
        if mark is not None and mark.lsn > state.log_complete_from:
            t0 = time.perf_counter()
            deleted = await retention.delete_before(state, mark, now)
            metrics.retention_deleted.inc(deleted)
            log.info("retention: deleted %d records before LSN %d (written %s ago) in %.2fs; %d kept, live state "
                     "is derived from them", deleted, mark.lsn, _age(ages[mark.ms].ms), time.perf_counter() - t0,
                     len(mark.needed))
        expired = retention.expire(state, now)
        if expired:
            log.info("retention: %d decided jobs and decisions nobody may still ask about expired", expired)
        metrics.log_start.set(state.log_complete_from)
        metrics.log_bytes.set(state.log_bytes - (mark.log_bytes if mark is not None else 0))
        return deleted


def _age(ms: int) -> str:
    s = ms / 1000
    return f"{s:.1f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"
