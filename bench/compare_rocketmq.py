"""Apache RocketMQ side of bench/compare.py: the same workloads through bench/rocketmq/ (peer.py starts
name server + broker, workloads.py runs the TxBench driver, python_client.py the Python client).

Per flush mode, as bench/rocketmq/run.py does it:
  1. a broker with RocketMQ's documented defaults: untimed JIT warm-up (workloads.warm_broker), then
     workload 1 (tx_single_w1/8/32), 3 (delivery_tx_light / _saturated) and 4 (send_baseline_w1/8/32);
  2. a second broker with transactionCheckInterval set for workload 2 (the same interval txbroker gets);
  3. with python_client: name server + proxy in local mode, rocketmq-python-client at 1/8/32 threads.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH / "rocketmq"))
import python_client as PC  # noqa: E402  (bench/rocketmq/python_client.py)
import workloads as W  # noqa: E402  (bench/rocketmq/workloads.py)
from peer import DEFAULT_VERSION, RocketMQPeer  # noqa: E402

from compare_meter import Meter  # noqa: E402
from compare_txbroker import checkback_figures  # noqa: E402

FLUSH = {"ASYNC": "ASYNC_FLUSH", "SYNC": "SYNC_FLUSH"}
CONCURRENCY = (1, 8, 32)


def default_cases(timing: W.Timing) -> list[W.Case]:
    """Workloads 1, 3 (transactions only) and 4 from workloads.default_broker_cases."""
    keep = {f"tx_single_w{n}" for n in CONCURRENCY} | {f"send_baseline_w{n}" for n in CONCURRENCY} | {
        "delivery_tx_light_w1_sleep10ms", "delivery_tx_saturated_w8"}
    return [c for c in W.default_broker_cases(timing) if c.name in keep]


def checkback_cases(timing: W.Timing) -> list[W.Case]:
    return [c for c in W.fast_check_cases(timing) if c.workload == "2"]


def figures_of(entry: dict) -> dict:
    f = entry.get("figures") or {}
    if f.get("tx", {}).get("local_unknown"):
        return checkback_figures(f)
    lat = f.get("latency", {})
    out = {"ops_per_s": f.get("ops_per_s"), "msgs_per_s": f.get("ops_per_s"), "p50_ms": lat.get("p50_ms"),
           "p99_ms": lat.get("p99_ms"), "max_ms": lat.get("max_ms"), "errors": f.get("failed")}
    c = f.get("consume")
    if c:
        d = c.get("commit_decision_to_delivery") or c.get("send_start_to_delivery") or {}
        out.update(deliver_p50_ms=d.get("p50_ms"), deliver_p99_ms=d.get("p99_ms"), deliver_max_ms=d.get("max_ms"),
                   delivered=c.get("delivered"), not_delivered=(c.get("expected") or 0) - (c.get("delivered") or 0),
                   duplicates=c.get("duplicates"))
    return out


def _pid(mq: RocketMQPeer, name: str) -> int | None:
    return next((p.pid for n, p in mq.procs if n == name), None)


def _case_key(name: str) -> tuple[str, str, int]:
    """(workload, case, concurrency) in compare.py's naming."""
    if name.startswith("tx_single_w"):
        n = int(name.rsplit("w", 1)[1])
        return "1", f"tx_c{n}", n
    if name.startswith("send_baseline_w"):
        n = int(name.rsplit("w", 1)[1])
        return "4", f"send_c{n}", n
    if name.startswith("delivery_tx_light"):
        return "3", "delivery_light_c1", 1
    if name.startswith("delivery_tx_saturated"):
        return "3", "delivery_saturated_c8", 8
    if name.startswith("tx_checkback"):
        return "2", "checkback_c8", 8
    if name.startswith("py_client_tx_c"):
        n = int(name.rsplit("c", 1)[1])
        return "1", f"tx_c{n}", n
    return "warmup", name, 0


def run_all(flush: str, timing: W.Timing, check_interval_ms: int, python_client: bool, version: str = DEFAULT_VERSION,
            log=print, on_case=None, peers: list | None = None, only=("1", "2", "3", "4", "5")) -> list[dict]:
    """Every RocketMQ case of one flush mode ("ASYNC" | "SYNC"); on_case(result) after each."""
    rflush = FLUSH[flush]
    results: list[dict] = []

    def done(entry: dict, meter: dict, driver: str) -> None:
        workload, case, n = _case_key(entry["name"])
        r = {"system": "rocketmq", "flush": flush, "workload": workload, "case": case, "concurrency": n,
             "driver": driver, "rocketmq_case": entry["name"], "figures": figures_of(entry), "meter": meter,
             "command": entry.get("command"), "raw": entry, "is_warmup": bool(entry.get("is_warmup"))}
        if entry.get("error"):
            r["error"] = entry["error"]
        results.append(r)
        if on_case:
            on_case(r)

    plans = [({}, default_cases(timing)), ({"transactionCheckInterval": check_interval_ms}, checkback_cases(timing))]
    for overrides, cases in plans:
        # workload 5 (our batches) is set beside RocketMQ's workload 1
        cases = [c for c in cases if c.workload in only or (c.workload == "1" and "5" in only)]
        if not cases:
            continue
        try:
            with RocketMQPeer(version=version, flush=rflush, broker_overrides=overrides, log=log) as mq:
                if peers is not None:
                    peers.append(mq.describe())
                broker = _pid(mq, "broker")
                if timing.broker_warmup_s > 0:
                    m = Meter(broker)
                    done(W.warm_broker(mq, timing, log=log), m.stop(), "TxBench (Java)")
                for i, case in enumerate(cases):
                    topic = f"Cmp_{flush}_{i}_{case.name.replace('.', '_')}"[:100]
                    mq.create_topic(topic, queues=8)
                    m = Meter(broker)
                    done(W.run_case(mq, case, timing, topic, log=log), m.stop(), "TxBench (Java)")
        except Exception as e:  # noqa: BLE001 - a peer that would not start: report, go on
            log(f"[rocketmq {flush}] FAILED: {type(e).__name__}: {e}")
            results.append({"system": "rocketmq", "flush": flush, "workload": "peer", "case": "start",
                            "error": f"{type(e).__name__}: {str(e)[-2000:]}", "broker_overrides": overrides})
    if python_client:
        try:
            with RocketMQPeer(version=version, flush=rflush, proxy=True, log=log) as mq:
                if peers is not None:
                    peers.append(mq.describe())
                proxy = _pid(mq, "proxy")
                t = timing
                for n in CONCURRENCY:
                    # one call per concurrency so each case gets its own meter; the proxy's JIT warm-up
                    # (timing.broker_warmup_s) runs with the first only
                    m = Meter(proxy)
                    entries = PC.run_all(mq, t, concurrencies=(n,), log=log)
                    for e in entries[:-1]:
                        done(e, {}, "rocketmq-python-client")
                    done(entries[-1], m.stop(), "rocketmq-python-client")
                    t = W.Timing(**{**timing.__dict__, "broker_warmup_s": 0.0})
        except Exception as e:  # noqa: BLE001
            log(f"[rocketmq {flush} proxy] FAILED: {type(e).__name__}: {e}")
            results.append({"system": "rocketmq", "flush": flush, "workload": "peer", "case": "proxy start",
                            "error": f"{type(e).__name__}: {str(e)[-2000:]}"})
    return results


def run_groups(flush: str, timing: W.Timing, groups: int, version: str = DEFAULT_VERSION, log=print, on_case=None,
               peers: list | None = None) -> list[dict]:
    """Workload 1 (tx_single_w1/8/32) on `groups` RocketMQ broker groups: masters broker-a, broker-b, ...
    under one name server (peer.py's brokers=N), each topic on all of them (updateTopic -c DefaultCluster,
    8 queues per broker); TxBench's one producer spreads its sends over every queue of the topic, so
    over the groups. Broker CPU is the broker JVMs' summed (compare_txbroker._Meters)."""
    from compare_txbroker import _Meters  # noqa: PLC0415

    results: list[dict] = []

    def done(entry: dict, meter: dict) -> None:
        _, case, n = _case_key(entry["name"])
        r = {"system": "rocketmq", "flush": flush, "workload": "1" if n else "warmup",
             "case": f"{case}_g{groups}" if n else case, "concurrency": n, "driver": "TxBench (Java)",
             "rocketmq_case": entry["name"], "figures": figures_of(entry), "meter": meter,
             "command": entry.get("command"), "raw": entry, "is_warmup": bool(entry.get("is_warmup")),
             "groups": groups}
        if entry.get("error"):
            r["error"] = entry["error"]
        results.append(r)
        if on_case:
            on_case(r)

    cases = [c for c in default_cases(timing) if c.workload == "1"]
    try:
        with RocketMQPeer(version=version, flush=FLUSH[flush], brokers=groups, log=log) as mq:
            if peers is not None:
                peers.append(mq.describe())
            if timing.broker_warmup_s > 0:
                m = _Meters(mq.broker_pids)
                done(W.warm_broker(mq, timing, log=log), m.stop())
            for i, case in enumerate(cases):
                topic = f"Cmp_{flush}_g{groups}_{i}_{case.name}"[:100]
                mq.create_topic(topic, queues=8)
                m = _Meters(mq.broker_pids)
                done(W.run_case(mq, case, timing, topic, log=log), m.stop())
    except Exception as e:  # noqa: BLE001 - a peer that would not start: report, go on
        log(f"[rocketmq {flush} {groups} groups] FAILED: {type(e).__name__}: {e}")
        results.append({"system": "rocketmq", "flush": flush, "workload": "peer", "case": f"groups{groups}_start",
                        "error": f"{type(e).__name__}: {str(e)[-2000:]}"})
    return results
