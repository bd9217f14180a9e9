"""Over-the-network workloads: a fresh broker subprocess per run, load from separate client processes.

One run = one broker (fresh data dir) + P load-generator processes (+ one tailing reader for the
commit-to-visible workload). All client processes connect, then start together at a shared
time.monotonic() instant; the first `warmup` seconds are not counted; figures are taken over the
following `duration` seconds. CPU of the broker (whole process and its event-loop thread), of the
clients and of the whole (shared) machine is sampled over the same window.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common import (
    PYTHON, BrokerProcess, CpuSnapshot, host_speed_ms, loadavg, percentiles, saturation, track, untrack,
)

LOADGEN = str(Path(__file__).resolve().with_name("loadgen.py"))


@dataclass
class Spec:
    name: str  # short id in the table
    mode: str  # tx | plain
    flush: str = "ASYNC"
    producers: int = 8
    inflight: int = 1  # coroutines per producer
    batch: int = 1
    procs: int = 1  # client processes the producers are spread over
    duration: float = 10.0
    warmup: float = 2.0
    rate: float = 0.0  # total operations/s (0: closed loop)
    tail: bool = False  # also run a tailing reader and measure commit-to-visible
    pipelined_end: bool = False  # tx: the next transaction goes while the last END is on its way (loadgen.py)
    queues: int = 4
    size: int = 1024
    uvloop: bool = True
    seed_dir: str = ""  # start the broker on a copy of this store (e.g. 1M finished transactions)
    profile: str = ""  # py-spy output path (SVG / speedscope) for the broker during the window
    note: str = ""
    extra: dict = field(default_factory=dict)


def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    r, _, _ = select.select([proc.stdout], [], [], timeout)
    if not r:
        raise TimeoutError("client process did not report READY")
    return proc.stdout.readline().decode()


def run_once(spec: Spec, workdir: str) -> dict:
    topic = f"Bench{spec.mode.capitalize()}"
    result: dict = {"spec": asdict(spec), "loadavg_before": loadavg(), "host_speed_ms": host_speed_ms()}
    data_dir = None
    if spec.seed_dir:
        data_dir = os.path.join(workdir, "store")
        t0 = time.monotonic()
        shutil.copytree(spec.seed_dir, data_dir)
        result["seed_copy_seconds"] = round(time.monotonic() - t0, 2)
    with BrokerProcess(spec.flush, data_dir=data_dir) as broker:
        broker.create_topic(topic, spec.queues)
        result["broker_command"] = shlex.join(broker.cmd)
        result["broker_ready_seconds"] = round(broker.ready_seconds, 3)
        clients: list[tuple[str, str, list[str]]] = []  # (result file, kind, command)
        per_proc = _split(spec.producers, spec.procs)
        rate_each = [spec.rate * n / spec.producers for n in per_proc] if spec.rate else [0.0] * len(per_proc)
        common = ["--broker", broker.address, "--topic", topic, "--warmup", str(spec.warmup),
                  "--duration", str(spec.duration), "--size", str(spec.size)]
        if not spec.uvloop:
            common.append("--no-uvloop")
        commands = []
        if spec.tail:
            out = os.path.join(workdir, "tail.json")
            cmd = spec.extra.get("tail_prefix", []) + [PYTHON, LOADGEN, "--mode", "tail", "--out", out,
                                                       "--wait-ms", "1000"] + common
            commands.append(cmd)
            clients.append((out, "tail", cmd))
        for i, n in enumerate(per_proc):
            out = os.path.join(workdir, f"w{i}.json")
            cmd = [PYTHON, LOADGEN, "--mode", spec.mode, "--producers", str(n), "--inflight", str(spec.inflight),
                   "--batch", str(spec.batch), "--rate", str(rate_each[i]), "--worker-id", f"w{i}",
                   "--out", out] + common
            if spec.tail:
                cmd.append("--record-commits")
            if spec.pipelined_end:
                cmd.append("--pipelined-end")
            commands.append(cmd)
            clients.append((out, "load", cmd))
        result["client_commands"] = [shlex.join(c) for c in commands]
        procs = []
        errlogs = []
        try:
            for out, kind, cmd in clients:
                err = open(out + ".stderr", "wb")
                errlogs.append(err)
                p = track(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err))
                procs.append((p, out, kind))
            for p, _, _ in procs:
                line = _readline(p, 120)
                if line.strip() != "READY":
                    raise RuntimeError(f"client said {line!r}")
            start = time.monotonic() + 0.3
            for p, _, _ in procs:
                p.stdin.write(f"{start}\n".encode())
                p.stdin.flush()
            open_at = start + spec.warmup
            close_at = open_at + spec.duration
            time.sleep(max(0.0, open_at - time.monotonic()))
            pids = [p.pid for p, _, _ in procs]
            c0 = CpuSnapshot(broker.pid, pids)
            spy = None
            if spec.profile:
                spy = _start_pyspy(broker.pid, spec.profile, spec.duration)
            time.sleep(max(0.0, close_at - time.monotonic()))
            c1 = CpuSnapshot(broker.pid, pids)
            result["loadavg_after"] = loadavg()
            cpu = c1.since(c0)
            result["cpu"] = cpu
            result["saturated"] = saturation(cpu)
            for p, _, _ in procs:
                p.wait(timeout=spec.duration + 120)
            if spy is not None:
                try:
                    spy.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    spy.kill()
                result["profile"] = spec.profile
            result["flush"] = broker.flush_stats()
        finally:
            for p, _, _ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                untrack(p)
            for e in errlogs:
                e.close()
        rc = broker.stop()
        result["broker_exit_code"] = rc
    loads, tail = [], None
    for p, out, kind in procs:
        if p.returncode != 0:
            raise RuntimeError(f"client {kind} exited {p.returncode}: " + Path(out + ".stderr").read_text()[-2000:])
        doc = json.load(open(out))
        if kind == "tail":
            tail = doc
        else:
            loads.append(doc)
    ops = sum(d["ops_in_window"] for d in loads)
    lat = [x for d in loads for x in d["latency_ms"]]
    errors: dict[str, int] = {}
    for d in loads:
        for k, v in d["errors"].items():
            errors[k] = errors.get(k, 0) + v
    result["ops_per_s"] = ops / spec.duration
    result["msgs_per_s"] = ops * spec.batch / spec.duration
    result["latency_ms"] = _round(percentiles(lat))
    result["errors"] = errors
    if tail is not None:
        commit_at: dict[str, float] = {}
        acked_at: dict[str, float] = {}
        for d in loads:
            commit_at.update(d.get("commit_at", {}))
            acked_at.update(d.get("acked_at", {}))
        arrivals = tail["arrivals"]
        vis, after_ack, commit_rtt = [], [], []
        missing = 0
        for txid, t in commit_at.items():
            if not open_at <= t <= close_at:
                continue
            a = arrivals.get(txid)
            if a is None:
                missing += 1
                continue
            vis.append((a - t) * 1000.0)
            ack = acked_at.get(txid)
            if ack is not None:
                after_ack.append((a - ack) * 1000.0)
                commit_rtt.append((ack - t) * 1000.0)
        result["commit_to_visible_ms"] = _round(percentiles(vis))
        # the same arrivals measured from the producer's COMMIT acknowledgement (negative: seen first)
        result["ack_to_visible_ms"] = _round(percentiles(after_ack))
        result["commit_to_ack_ms"] = _round(percentiles(commit_rtt))
        result["tail"] = {"received": tail["received"], "duplicates": tail["duplicates"],
                          "committed_in_window_not_seen": missing}
    return result


def _round(d: dict) -> dict:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}


def _start_pyspy(pid: int, path: str, duration: float) -> subprocess.Popen | None:
    exe = Path(PYTHON).with_name("py-spy")
    if not exe.exists():
        return None
    fmt = "speedscope" if path.endswith(".json") else ("raw" if path.endswith(".txt") else "flamegraph")
    cmd = [str(exe), "record", "--pid", str(pid), "--duration", str(max(1, int(duration))), "--rate", "250",
           "--format", fmt, "--output", path, "--nonblocking"]
    # e.g. TXBROKER_BENCH_PYSPY="--idle --native": where the loop waits, and time inside RocksDB
    extra = os.environ.get("TXBROKER_BENCH_PYSPY", "").split()
    if "--native" in extra:
        cmd.remove("--nonblocking")  # py-spy reads native stacks only from a paused process
    cmd += extra
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run(spec: Spec, repeats: int, log=print) -> dict:
    """Run `spec` `repeats` times (fresh broker each time); keep every run and the best/spread."""
    runs = []
    for i in range(repeats):
        with tempfile.TemporaryDirectory(prefix="txbroker-bench-clients-") as wd:
            r = run_once(spec, wd)
        runs.append(r)
        lat = r["latency_ms"]
        line = (f"  {spec.name} run {i + 1}/{repeats}: {r['ops_per_s']:,.0f} ops/s"
                f" ({r['msgs_per_s']:,.0f} msgs/s), p50 {lat.get('p50', 0):.2f} ms p99 {lat.get('p99', 0):.2f} ms;"
                f" cpu broker {r['cpu']['broker_pct']:.0f}% (loop {r['cpu']['broker_main_thread_pct']:.0f}%),"
                f" clients {r['cpu']['clients_pct']:.0f}% {r['cpu']['client_main_threads_pct']},"
                f" others {r['cpu']['others_pct']:.0f}%; flush {r.get('flush')}; host {r['host_speed_ms']:.0f} ms")
        if "commit_to_visible_ms" in r:
            v = r["commit_to_visible_ms"]
            a = r["commit_to_ack_ms"]
            line += (f"; commit->visible p50 {v.get('p50', 0):.2f} p99 {v.get('p99', 0):.2f} ms"
                     f" (commit->ack p50 {a.get('p50', 0):.2f} p99 {a.get('p99', 0):.2f}); tail {r['tail']}")
        if r["errors"]:
            line += f"; ERRORS {r['errors']}"
        log(line)
    best = max(runs, key=lambda r: r["ops_per_s"])
    return {"name": spec.name, "spec": asdict(spec), "runs": runs, "best_index": runs.index(best)}
