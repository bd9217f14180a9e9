"""txbroker side of bench/compare.py: the issue-8 workloads against one broker process per flush mode.

The load comes from bench/broker's load generator (network.py + loadgen.py: separate uvloop client
processes, N AsyncTransactionProducer / AsyncProducer instances with one connection each, a tailing
reader for commit-to-delivery). network.run_once starts a fresh broker for every run; here every
case of a flush mode runs against ONE broker, as RocketMQ's cases run against one broker, by handing
network.py an adapter around an already running `BrokerProcess` (`shared_broker`). Workload 2 runs
on a second broker started with --check-interval-ms set to the same value as RocketMQ's
transactionCheckInterval for that workload, with bench/compare_checkback.py as the client.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import urllib.error
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH / "broker"))
import network  # noqa: E402  (bench/broker/network.py)
from common import PYTHON, BrokerProcess, track, untrack  # noqa: E402
from network import Spec  # noqa: E402

from compare_meter import Meter  # noqa: E402

CHECKBACK = str(BENCH / "compare_checkback.py")
_FLUSH_METRICS = ("txbroker_flush_batch_records_count", "txbroker_flush_batch_records_sum",
                  "txbroker_flush_seconds_sum", "txbroker_flush_seconds_count", "txbroker_checkbacks_sent_total")


def metric_values(broker: BrokerProcess) -> dict[str, float]:
    try:
        text = broker.metrics_text()
    except OSError:
        return {}
    out = {}
    for name in _FLUSH_METRICS:
        m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


class _Shared:
    """Stands in for network.py's `BrokerProcess(flush, data_dir=...)`: the running broker, not
    stopped at the end of a run; create_topic is idempotent; flush figures cover this run only."""

    def __init__(self, broker: BrokerProcess, flush: str, data_dir=None):
        if flush != broker.flush:
            raise ValueError(f"case wants {flush} flush, the shared broker runs {broker.flush}")
        self._b = broker
        self.cmd, self.ready_seconds, self.address = broker.cmd, broker.ready_seconds, broker.address
        self._m0 = metric_values(broker)

    pid = property(lambda self: self._b.pid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def create_topic(self, name: str, queues: int) -> None:
        try:
            self._b.create_topic(name, queues)
        except urllib.error.HTTPError as e:
            if e.code != 409:  # exists already: created by an earlier case
                raise

    def flush_stats(self) -> dict:
        m1 = metric_values(self._b)
        d = {k: m1.get(k, 0.0) - self._m0.get(k, 0.0) for k in _FLUSH_METRICS}
        writes = d["txbroker_flush_batch_records_count"]
        if not writes:
            return {"writes": 0}
        return {"writes": int(writes),
                "records_per_write": round(d["txbroker_flush_batch_records_sum"] / writes, 1),
                "ms_per_write": round(1000 * d["txbroker_flush_seconds_sum"] / writes, 3)}

    def stop(self):
        return None


@contextlib.contextmanager
def shared_broker(broker: BrokerProcess):
    original = network.BrokerProcess
    network.BrokerProcess = lambda flush, data_dir=None: _Shared(broker, flush, data_dir)
    try:
        yield
    finally:
        network.BrokerProcess = original


@dataclass
class Case:
    workload: str  # "1" .. "5", as numbered in the issue
    name: str
    concurrency: int
    spec: Spec | None = None  # None: workload 2 (compare_checkback.py)
    note: str = ""


def cases(flush: str, duration: float, warmup: float, light_rate: float) -> list[Case]:
    def S(name, mode, producers, procs=1, **kw) -> Spec:
        return Spec(name=name, mode=mode, flush=flush, producers=producers, procs=procs, duration=duration,
                    warmup=warmup, queues=8, **kw)

    out = [Case("1", f"tx_c{n}", n, S(f"tx-{n}p", "tx", n, procs)) for n, procs in ((1, 1), (8, 1), (32, 2))]
    # RocketMQ's driver shares ONE producer (one connection) among its threads: the same shape here
    out += [Case("1", f"tx_c{n}_1conn", n, S(f"tx-1px{n}", "tx", 1, inflight=n),
                 note=f"one producer (one connection), {n} transactions in flight") for n in (8, 32)]
    # each END acknowledged, but not waited for before the next transaction (wait_end=False): one
    # round trip a transaction, as RocketMQ's one-way END
    out += [Case("1", f"tx_c{n}_pipelined", n, S(f"tx-{n}p-pipelined", "tx", n, procs, pipelined_end=True),
                 note="END_TRANSACTION acknowledged, not waited for before the next transaction")
            for n, procs in ((1, 1), (8, 1), (32, 2))]
    out += [
        Case("3", "delivery_light_c1", 1, S("deliver-light", "tx", 1, rate=light_rate, tail=True),
             note=f"1 producer paced to {light_rate:g} tx/s"),
        Case("3", "delivery_saturated_c8", 8, S("deliver-saturated", "tx", 8, tail=True)),
    ]
    out += [Case("4", f"send_c{n}", n, S(f"plain-{n}p", "plain", n, procs)) for n, procs in ((1, 1), (8, 1), (32, 2))]
    out += [Case("5", f"batch100_c{n}", n, S(f"batch100-{n}p", "tx", n, procs, batch=100))
            for n, procs in ((1, 1), (8, 1), (32, 2))]
    return out


def figures_of(run: dict) -> dict:
    lat = run.get("latency_ms", {})
    f = {"ops_per_s": round(run["ops_per_s"], 1), "msgs_per_s": round(run["msgs_per_s"], 1),
         "p50_ms": lat.get("p50"), "p99_ms": lat.get("p99"), "max_ms": lat.get("max"),
         "errors": sum(run.get("errors", {}).values())}
    if "commit_to_visible_ms" in run:
        d = run["commit_to_visible_ms"]
        f.update(deliver_p50_ms=d.get("p50"), deliver_p99_ms=d.get("p99"), deliver_max_ms=d.get("max"),
                 delivered=d.get("n"), not_delivered=run["tail"]["committed_in_window_not_seen"],
                 duplicates=run["tail"]["duplicates"])
    return f


def run_network_case(broker: BrokerProcess, case: Case, log=print) -> dict:
    meter = Meter(broker.pid)
    with shared_broker(broker):
        entry = network.run(case.spec, 1, log=log)
    run = entry["runs"][0]
    return {"figures": figures_of(run), "meter": meter.stop(), "raw": run}


def run_checkback(broker: BrokerProcess, producers: int, unknown: float, duration: float, warmup: float,
                  drain: float, consume_wait: float, log=print) -> dict:
    topic = "CmpCheckback"
    broker.create_topic(topic, 8)
    with tempfile.TemporaryDirectory(prefix="txbroker-compare-") as wd:
        out = os.path.join(wd, "checkback.json")
        cmd = [PYTHON, CHECKBACK, "--broker", broker.address, "--topic", topic, "--producers", str(producers),
               "--unknown", str(unknown), "--warmup", str(warmup), "--duration", str(duration),
               "--drain", str(drain), "--consume-wait", str(consume_wait), "--out", out]
        log(f"  {shlex.join(cmd[1:])}")
        m0 = metric_values(broker)
        meter = Meter(broker.pid)
        p = track(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        try:
            text, _ = p.communicate(timeout=warmup + duration + drain + consume_wait + 120)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
        finally:
            untrack(p)
        meter = meter.stop()
        if p.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"compare_checkback.py exited {p.returncode}: {text[-2000:]}")
        doc = json.load(open(out))
    sent = metric_values(broker).get("txbroker_checkbacks_sent_total", 0) - m0.get("txbroker_checkbacks_sent_total", 0)
    doc["tx"]["checkbacks_sent_by_broker"] = int(sent)
    return {"figures": checkback_figures(doc), "meter": meter, "raw": doc, "command": shlex.join(cmd),
            "broker_command": shlex.join(broker.cmd)}


def checkback_figures(doc: dict) -> dict:
    """The comparable figures of a workload-2 result (TxBench's or compare_checkback's: same names)."""
    tx, lat = doc["tx"], doc.get("latency", {})
    res = tx.get("unknown_to_resolved", {})
    c = doc.get("consume") or {}
    return {"ops_per_s": doc.get("ops_per_s"), "p50_ms": lat.get("p50_ms"), "p99_ms": lat.get("p99_ms"),
            "local_unknown": tx.get("local_unknown"), "checks": tx.get("checks"),
            "checkbacks_sent_by_broker": tx.get("checkbacks_sent_by_broker"),
            "checks_per_unknown": round(tx["checks"] / tx["local_unknown"], 3) if tx.get("local_unknown") else None,
            "all_resolved_after_send_end_s": tx.get("all_resolved_after_send_end_s"),
            "unresolved_at_end": tx.get("unknown_unresolved_at_end"),
            "resolve_p50_s": round(res["p50_ms"] / 1000, 2) if res.get("p50_ms") is not None else None,
            "resolve_max_s": round(res["max_ms"] / 1000, 2) if res.get("max_ms") is not None else None,
            "delivered": c.get("delivered"), "expected": c.get("expected"), "duplicates": c.get("duplicates")}


def run_all(flush: str, timing, light_rate: float, check_interval_ms: int, log=print, on_case=None,
            only=("1", "2", "3", "4", "5")) -> list[dict]:
    """Every txbroker case of one flush mode ("ASYNC" | "SYNC") whose workload is in `only`;
    on_case(result) after each."""
    results = []
    todo = [c for c in cases(flush, timing.duration_s, timing.warmup_s, light_rate) if c.workload in only]

    def done(case: Case, r: dict) -> None:
        r.update(system="txbroker", flush=flush, workload=case.workload, case=case.name,
                 concurrency=case.concurrency, note=case.note)
        results.append(r)
        if on_case:
            on_case(r)

    if todo:
        with BrokerProcess(flush) as broker:
            _run_on(broker, flush, todo, done, log)
    if "2" not in only:
        return results
    case = Case("2", "checkback_c8", 8, note=f"check interval {check_interval_ms} ms")
    log(f"[txbroker {flush}] workload 2 {case.name} (broker with --check-interval-ms {check_interval_ms})")
    try:
        with BrokerProcess(flush, extra=["--check-interval-ms", str(check_interval_ms)]) as broker:
            r = run_checkback(broker, 8, 0.333, timing.duration_s, timing.warmup_s, timing.drain_s_fast_interval,
                              timing.consume_wait_s, log=log)
    except Exception as e:  # noqa: BLE001
        log(f"  FAILED: {type(e).__name__}: {e}")
        r = {"error": f"{type(e).__name__}: {e}"}
    done(case, r)
    return results


def _run_on(broker: BrokerProcess, flush: str, todo: list[Case], done, log) -> None:
    log(f"[txbroker] broker pid {broker.pid} ({flush}): {shlex.join(broker.cmd)}")
    for case in todo:
        log(f"[txbroker {flush}] workload {case.workload} {case.name}")
        try:
            r = run_network_case(broker, case, log=log)
            r["broker_command"] = shlex.join(broker.cmd)
            r["command"] = " ; ".join(r["raw"].get("client_commands", []))
        except Exception as e:  # noqa: BLE001 - report it, go on with the next case
            log(f"  FAILED: {type(e).__name__}: {e}")
            r = {"error": f"{type(e).__name__}: {e}"}
        done(case, r)


# ---- broker groups (tracker issue 18): compare.py --groups N ---------------------------------------------

class _Meters:
    """compare_meter.Meter over a case, its server_pct the CPU of several broker processes summed
    (every group's broker), clients_pct what this benchmark's other processes took."""

    def __init__(self, pids: list[int]):
        from common import process_cpu  # noqa: PLC0415
        self._cpu = process_cpu
        self.pids = pids
        self.meter = Meter(None)
        self.cpu0 = {p: process_cpu(p) for p in pids}

    def stop(self) -> dict:
        out = self.meter.stop()
        each = [round(100 * (self._cpu(p) - self.cpu0[p]) / out["seconds"], 1) if out["seconds"] else 0.0
                for p in self.pids]
        out.update(server_pct=round(sum(each), 1), server_pct_each=each,
                   clients_pct=round(max(0.0, out["this_benchmark_pct"] - sum(each)), 1))
        return out


def group_cases(flush: str, duration: float, warmup: float, groups: int) -> list[Case]:
    return [Case("1", f"tx_c{n}_g{groups}", n,
                 Spec(f"tx-{n}p-g{groups}", "tx", flush=flush, producers=n, procs=procs, duration=duration,
                      warmup=warmup, queues=8),
                 note=f"{groups} broker groups (masters), AsyncClusterTransactionProducer: each transaction "
                      "whole to one group, the next in turn")
            for n, procs in ((1, 1), (8, 1), (32, 2))]


def run_groups(flush: str, timing, groups: int, log=print, on_case=None) -> list[dict]:
    """Workload 1 (single-message transactions, 1/8/32 producers) on a cluster of `groups` broker
    groups (bench/groups_bench.py's Cluster: one master each, one route file), load from the same
    load generator with cluster producers; one cluster for every case, as one broker serves the
    single-broker cases."""
    import groups_bench  # noqa: PLC0415  (bench/groups_bench.py)

    results = []
    try:
        cluster = groups_bench.Cluster(groups, flush).start()
    except Exception as e:  # noqa: BLE001
        log(f"[txbroker {flush} {groups} groups] FAILED to start: {type(e).__name__}: {e}")
        r = {"system": "txbroker", "flush": flush, "workload": "1", "case": f"groups{groups}_start",
             "error": f"{type(e).__name__}: {e}"}
        if on_case:
            on_case(r)
        return [r]
    try:
        log(f"[txbroker] {groups} broker groups ({flush}): " + " ; ".join(cluster.describe()["broker_commands"]))
        for case in group_cases(flush, timing.duration_s, timing.warmup_s, groups):
            log(f"[txbroker {flush}] workload 1 {case.name}")
            try:
                meter = _Meters(list(cluster.brokers.values()))
                with groups_bench.on_cluster("single", shared=cluster):
                    entry = network.run(case.spec, 1, log=log)
                run = entry["runs"][0]
                r = {"figures": figures_of(run), "meter": meter.stop(), "raw": run,
                     "broker_command": " ; ".join(cluster.describe()["broker_commands"]),
                     "command": " ; ".join(run.get("client_commands", [])), "groups": groups}
            except Exception as e:  # noqa: BLE001
                log(f"  FAILED: {type(e).__name__}: {e}")
                r = {"error": f"{type(e).__name__}: {e}"}
            r.update(system="txbroker", flush=flush, workload=case.workload, case=case.name,
                     concurrency=case.concurrency, note=case.note)
            results.append(r)
            if on_case:
                on_case(r)
    finally:
        cluster.stop()
    return results
