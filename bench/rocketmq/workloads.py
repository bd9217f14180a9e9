"""Workload runners for the Apache RocketMQ peer (tracker issue 8).

Each runner starts the benchmark driver against a running ``RocketMQPeer``, bounded in time (the
driver stops its own send loop after warm-up + duration; ``run_bounded`` kills the process group if
it overruns), and returns a dict with the exact command, the driver's figures, and the per-interval
time series parsed from its STAT lines.

The driver is ``TxBench`` (java/TxBench.java, compiled by fetch.sh), txbroker's own re-implementation
of RocketMQ's ``org.apache.rocketmq.example.benchmark.TransactionProducer`` / ``Producer`` /
``Consumer`` workload: those classes live in ``rocketmq-example``, which Apache does not publish to
Maven Central for 4.3+/5.x. Same option letters and meanings (-w -s -t -n -sr -su -cr -cu), plus a
duration, warm-up, percentiles, a check-back drain phase and an in-process consumer.

Workloads (numbers as in the issue):
  1  tx_single       single-message transactions, all COMMIT, 1 / 8 / 32 threads, 1 KiB
  2  tx_checkback    1/3 of local transactions answer UNKNOWN (TransactionProducer's -su 0.333);
                     every check-back answers COMMIT (-cu 0). Sends for the duration, then waits
                     until check-back has resolved every UNKNOWN (bounded). Broker settings:
                     documented defaults (transactionCheckInterval 30 s, transactionTimeOut 6 s,
                     transactionCheckMax 15) -- and a second run on a broker with
                     transactionCheckInterval=5000 ms set explicitly (run.py says which).
                     A push consumer in the driver's JVM checks that every committed message,
                     including those committed by check-back, is delivered exactly once.
                     Note on the options: -su makes executeLocalTransaction answer UNKNOWN; -cu
                     makes the *check-back* answer UNKNOWN again (another check round later).
  2b tx_recheck      (fast-check broker only) -su 0.333 and -cu 0.5: half of the check-backs answer
                     UNKNOWN again, so messages need 2+ check rounds.
  3  delivery        transactions (and, as a baseline, plain sends) with a push consumer in the same
                     JVM: commit-decision -> delivery latency, at a light load (1 thread, 10 ms pause)
                     and at saturation (8 threads).
  4  send_baseline   plain (non-transactional) sync sends, 1 / 8 / 32 threads, 1 KiB.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from dataclasses import dataclass, field

from peer import RocketMQPeer, run_bounded

STAT_RE = re.compile(r"^STAT t=(?P<t>[\d.]+) tps=(?P<tps>[\d.]+) avg_ms=(?P<avg>[\d.]+) max_ms=(?P<max>[\d.]+) "
                     r"failed=(?P<failed>\d+) checks=(?P<checks>\d+) pending_unknown=(?P<pending>\d+) "
                     r"delivered=(?P<delivered>\d+)")
DRAIN_RE = re.compile(r"^STAT drain t=(?P<t>[\d.]+) pending_unknown=(?P<pending>\d+) checks=(?P<checks>\d+)")


@dataclass
class Timing:
    duration_s: float = 20.0
    warmup_s: float = 5.0
    report_s: float = 5.0
    drain_s_default_interval: float = 150.0   # 30 s check interval: up to ~3 rounds + transactionTimeOut
    drain_s_fast_interval: float = 60.0
    consume_wait_s: float = 20.0
    broker_warmup_s: float = 15.0             # untimed load on each fresh broker first (JIT, page cache)

    @classmethod
    def quick(cls) -> "Timing":
        return cls(duration_s=3.0, warmup_s=1.0, report_s=1.0, drain_s_default_interval=45.0,
                   drain_s_fast_interval=20.0, consume_wait_s=10.0, broker_warmup_s=3.0)


@dataclass
class Case:
    workload: str           # "1", "2", "2b", "3", "4"
    name: str
    mode: str               # tx | send
    threads: int
    size: int = 1024
    su: float = 0.0
    sr: float = 0.0
    cu: float = 0.0
    cr: float = 0.0
    drain_s: float = 0.0
    consume: bool = False
    sleep_ms: int = 0
    extra: list = field(default_factory=list)


def parse_output(out: str) -> tuple[dict | None, list[dict], list[dict]]:
    result, series, drain = None, [], []
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            continue
        m = STAT_RE.match(line)
        if m:
            series.append({"t": float(m["t"]), "tps": float(m["tps"]), "avg_ms": float(m["avg"]),
                           "max_ms": float(m["max"]), "failed": int(m["failed"]), "checks": int(m["checks"]),
                           "pending_unknown": int(m["pending"]), "delivered": int(m["delivered"])})
            continue
        m = DRAIN_RE.match(line)
        if m:
            drain.append({"t": float(m["t"]), "pending_unknown": int(m["pending"]), "checks": int(m["checks"])})
    return result, series, drain


def run_case(mq: RocketMQPeer, case: Case, timing: Timing, topic: str, log=print) -> dict:
    args = [case.mode, "-n", mq.namesrv_addr, "-t", topic, "-w", str(case.threads), "-s", str(case.size),
            "-d", str(timing.duration_s), "-warmup", str(timing.warmup_s), "-i", str(timing.report_s)]
    if case.mode == "tx":
        args += ["-sr", str(case.sr), "-su", str(case.su), "-cr", str(case.cr), "-cu", str(case.cu)]
        if case.drain_s:
            args += ["-drain", str(case.drain_s)]
    if case.consume:
        args += ["-consume", "-consumeWait", str(timing.consume_wait_s)]
    if case.sleep_ms:
        args += ["-sleep", str(case.sleep_ms)]
    args += case.extra
    # client JVM: heap for the latency samples; the broker keeps its 1 GiB
    cmd = mq.java_cmd("TxBench", *args, heap="768m")
    bound = timing.warmup_s + timing.duration_s + case.drain_s + (timing.consume_wait_s if case.consume else 0) + 120
    log(f"[bench] {case.name}: {' '.join(args)}")
    t0 = time.monotonic()
    rc, out = run_bounded(cmd, bound, env=None, on_line=lambda l: log("   " + l) if not l.startswith("RESULT") else None)
    wall = time.monotonic() - t0
    result, series, drain = parse_output(out)
    entry = {
        "workload": case.workload,
        "name": case.name,
        "flush": mq.flush,
        "broker_overrides": dict(mq.broker_overrides),
        "command": shlex.join(cmd),
        "returncode": rc,
        "wall_s": round(wall, 2),
        "figures": result,
        "series": series,
        "drain_series": drain,
        "loadavg_after": os.getloadavg(),   # the machine's 1/5/15-min load right after this case
    }
    if result is None:
        entry["error"] = "driver printed no RESULT line"
        entry["output_tail"] = out[-4000:]
        log(f"[bench] {case.name}: FAILED (rc={rc})\n{out[-2000:]}")
    return entry


# ---------------------------------------------------------------- workload sets
def default_broker_cases(timing: Timing) -> list[Case]:
    """Cases run on a broker with RocketMQ's documented defaults."""
    cases = [Case("1", f"tx_single_w{w}", "tx", w) for w in (1, 8, 32)]
    cases.append(Case("2", "tx_checkback_su0.333_default_interval", "tx", 8, su=0.333,
                      drain_s=timing.drain_s_default_interval, consume=True))
    cases += [
        Case("3", "delivery_tx_light_w1_sleep10ms", "tx", 1, consume=True, sleep_ms=10),
        Case("3", "delivery_tx_saturated_w8", "tx", 8, consume=True),
        Case("3", "delivery_send_light_w1_sleep10ms", "send", 1, consume=True, sleep_ms=10),
        Case("3", "delivery_send_saturated_w8", "send", 8, consume=True),
    ]
    cases += [Case("4", f"send_baseline_w{w}", "send", w) for w in (1, 8, 32)]
    return cases


FAST_CHECK_OVERRIDES = {"transactionCheckInterval": 5000}


def fast_check_cases(timing: Timing) -> list[Case]:
    """Cases run on a broker with transactionCheckInterval=5000 ms (set explicitly; default 30000)."""
    return [
        Case("2", "tx_checkback_su0.333_interval5s", "tx", 8, su=0.333, drain_s=timing.drain_s_fast_interval,
             consume=True),
        Case("2b", "tx_recheck_su0.333_cu0.5_interval5s", "tx", 8, su=0.333, cu=0.5,
             drain_s=timing.drain_s_fast_interval, consume=True),
    ]


def warm_broker(mq: RocketMQPeer, timing: Timing, log=print) -> dict:
    """Untimed transactional load on a fresh broker so the first measured case does not pay for the
    broker's JIT warm-up. Its figures are kept in the report (marked warm-up) but are not a result."""
    topic = "TxBench_broker_warmup"
    mq.create_topic(topic, queues=8)
    t = Timing(**{**timing.__dict__, "duration_s": timing.broker_warmup_s, "warmup_s": 0.0})
    e = run_case(mq, Case("warmup", "broker_warmup_tx_w8", "tx", 8), t, topic, log=log)
    e["is_warmup"] = True
    return e


def run_cases(mq: RocketMQPeer, cases: list[Case], timing: Timing, log=print, on_entry=None) -> list[dict]:
    """Run the cases one after the other; on_entry(entry) is called after each (run.py saves there)."""
    out = []

    def done(e):
        out.append(e)
        if on_entry:
            on_entry(e)

    if timing.broker_warmup_s > 0:
        done(warm_broker(mq, timing, log=log))
    for i, case in enumerate(cases):
        # a fresh topic per case: no backlog, no consumer offsets left over from an earlier case
        topic = f"TxBench_{i}_{case.name.replace('.', '_')}"[:100]
        mq.create_topic(topic, queues=8)
        done(run_case(mq, case, timing, topic, log=log))
    return out
