"""Driver-side progress of a long Spark stage, from Spark's status tracker.

    with StageProgress(spark.sparkContext, f"{job}-send", "job J: 1/4 sending", log.info) as p:
        df.write.format("txbroker")...save()
    p.final   # tasks, done, running, failed, stage retries of the stage that wrote

A thread on the driver polls the tracker every `interval` seconds and logs one line
(`job J: 1/4 sending: stage 3: 3/4 tasks done, 1 running, 1 failed attempt (20s)`), and once more at the end;
the tasks do nothing for it, so the hot path is untouched. The counts also tell the caller whether
Spark discarded task attempts (failed, or a stage run again), whose half transactions check-back
rolls back.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class Snapshot:
    tasks: int = 0  # of the latest stage of the group's jobs (at the end: the one that wrote)
    done: int = 0
    running: int = 0
    failed: int = 0  # task attempts of that stage that failed: Spark discarded them
    stage_retries: int = 0  # that stage run again (a fetch failure): its earlier tasks were discarded
    stage: int = -1  # its Spark stage id (as in Spark's UI and logs)
    jobs: int = 0  # the group's Spark jobs, and how many of them have not ended
    jobs_running: int = 0

    def describe(self) -> str:
        if not self.tasks:
            return "starting"
        text = f"stage {self.stage}: {self.done}/{self.tasks} tasks done, {self.running} running"
        if self.failed:
            text += f", {self.failed} failed attempt{'s' if self.failed > 1 else ''}"
        if self.stage_retries:
            text += f", stage retried {self.stage_retries}x"
        return text


class StageProgress:
    def __init__(self, sc, group: str, label: str, emit, interval: float = 10.0):
        self.sc, self.group, self.label, self.emit = sc, group, label, emit
        self.interval = interval
        self.final = Snapshot()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def snapshot(self) -> Snapshot:
        """The group's latest stage with tasks started (the last one writes; earlier ones only
        shuffle its input, possibly as jobs of their own)."""
        tracker = self.sc.statusTracker()
        stage_ids, jobs, running = set(), 0, 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            info = tracker.getJobInfo(job_id)
            if info is not None:
                stage_ids.update(int(s) for s in info.stageIds)
                jobs += 1
                running += info.status not in ("SUCCEEDED", "FAILED")
        known = [st for st in map(tracker.getStageInfo, sorted(stage_ids)) if st is not None]
        started = [st for st in known if st.numActiveTasks + st.numCompletedTasks + st.numFailedTasks]
        if not (started or known):
            return Snapshot(jobs=jobs, jobs_running=running)
        st = (started or known)[-1]
        return Snapshot(st.numTasks, st.numCompletedTasks, st.numActiveTasks, st.numFailedTasks, st.currentAttemptId,
                        st.stageId, jobs, running)

    def _line(self, snap: Snapshot) -> None:
        self.emit("%s: %s (%.0fs)", self.label, snap.describe(), time.monotonic() - self._t0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._line(self.snapshot())
            except Exception:  # noqa: BLE001 - progress must never fail the job (e.g. the context stopping)
                return

    def __enter__(self) -> "StageProgress":
        self._t0 = time.monotonic()
        # The jobs started from this thread until the next setJobGroup belong to the group.
        self.sc.setJobGroup(self.group, self.label, interruptOnCancel=False)
        if self.interval > 0:
            self._thread = threading.Thread(target=self._run, name=f"progress-{self.group}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        failed = exc[0] is not None
        try:
            # The tracker is fed by Spark's listener bus, which may lag behind the jobs' end: wait
            # (briefly) for it to show them ended, so the counts the caller uses are complete.
            deadline = time.monotonic() + 10
            snap = self.snapshot()
            while (snap.jobs_running or snap.running or not (failed or snap.jobs)) and time.monotonic() < deadline:
                time.sleep(0.05)
                snap = self.snapshot()
        except Exception:  # noqa: BLE001
            return
        self.final = snap
        self._line(snap)
