"""py-spy profile of the txbroker broker under bench/compare.py's single-message transaction load.

For 1 and for 8 producers (one connection each; ASYNC flush, 1 KiB; network.py + loadgen.py), three
runs of the same load, each on a fresh broker:
  1. Python frames, `py-spy record --nonblocking --rate 250` (network.py's own py-spy run, raw
     format; idle samples excluded): self and inclusive shares per function;
  2. the same as an SVG flamegraph (the artefact to look at);
  3. `py-spy record --native` (pauses the broker for each sample, so fewer samples, 100/s): native
     frames too, grouped into where the CPU goes: socket system calls, RocksDB, msgspec, uvloop,
     the interpreter running broker code. `epoll_pwait` samples are the loop waiting (idle) and are
     reported apart.
Writes <out_dir>/summary.txt and tx-<N>p.svg; the raw stacks are summarised and deleted.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH / "broker"))
import network  # noqa: E402  (bench/broker/network.py)
import suite  # noqa: E402  (bench/broker/suite.py: top_frames)
from common import PYTHON, BrokerProcess, track, untrack  # noqa: E402

from compare_txbroker import shared_broker  # noqa: E402

PYSPY = str(Path(PYTHON).with_name("py-spy"))
GROUPS = (  # (group, substrings of a native frame), first match wins
    ("waiting in epoll (idle)", ("epoll_pwait", "epoll_wait")),
    ("socket system calls (send/recv)", ("write (libc", "writev", "sendmsg", "send (libc", "read (libc",
                                         "recv", "__libc_send", "__libc_recv")),
    ("fsync / RocksDB WAL sync", ("fsync", "fdatasync")),
    ("RocksDB (C++)", ("rocksdb", "rocksdict")),
    ("msgspec (de)serialization", ("ms_", "mpack", "msgspec", "_core.cpython")),
    ("uvloop / libuv", ("loop.c", "uv_", "core.c", "uvloop", "handles/", "libuv")),
)


def group_of(frame: str) -> str:
    for name, keys in GROUPS:
        if any(k in frame for k in keys):
            return name
    if ".py:" in frame:
        return "Python (broker code in the interpreter)"
    if "libpython" in frame or frame.startswith(("_Py", "Py", "PyEval")):
        return "CPython runtime (C)"
    return "other native (libc, malloc, ...)"


def native_groups(path: str) -> dict:
    """Leaf-frame shares per group; idle (epoll) reported apart and excluded from the busy shares."""
    counts: Counter = Counter()
    incl: Counter = Counter()
    total = 0
    for line in open(path):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not stack or not n.isdigit():
            continue
        total += int(n)
        counts[group_of(stack.split(";")[-1])] += int(n)
        if group_of(stack.split(";")[-1]) != "waiting in epoll (idle)":
            for f in {suite._short(x) for x in stack.split(";")
                      if ".py:" in x or ("(libc" in x and not x.startswith("0x"))}:
                incl[f] += int(n)
    idle = counts.pop("waiting in epoll (idle)", 0)
    busy = total - idle
    return {"samples": total, "idle_pct_of_samples": round(100 * idle / total, 1) if total else None,
            "busy_samples": busy,
            "busy_pct": [(g, round(100 * c / busy, 1)) for g, c in counts.most_common()] if busy else [],
            "busy_inclusive_pct": [(f, round(100 * c / busy, 1)) for f, c in incl.most_common(40)
                                   if c < busy] if busy else []}


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(BENCH.parent))
    except ValueError:
        return str(p)


def _spec(t, name: str, producers: int, profile: str = "") -> network.Spec:
    return network.Spec(name=name, mode="tx", producers=producers, duration=t.duration_s, warmup=t.warmup_s,
                        queues=8, profile=profile)


def _cpu_line(run: dict) -> str:
    c = run["cpu"]
    return (f"{run['ops_per_s']:,.0f} tx/s under py-spy, p50 {run['latency_ms'].get('p50', 0):.2f} ms; broker "
            f"process {c['broker_pct']:.0f}% of a core (event-loop thread {c['broker_main_thread_pct']:.0f}%, "
            f"threads {c['broker_threads_pct']}), client process {c['clients_pct']:.0f}%, other work on the "
            f"machine {c['others_pct']:.0f}%")


def run(out_dir: Path, t, log=print, producers=(1, 8)) -> dict:
    if not Path(PYSPY).exists():
        log(f"[profile] skipped: {PYSPY} is missing (.venv/bin/pip install -r bench/requirements.txt)")
        return {"error": "py-spy not installed"}
    out_dir.mkdir(parents=True, exist_ok=True)
    doc: dict = {"load": "single-message transactions, N producers (one connection each), ASYNC flush, 1 KiB",
                 "runs": []}
    lines = [f"py-spy profiles of the txbroker broker under single-message transactions: "
             f"{' and '.join(str(n) for n in producers)} producer(s) (one connection each), ASYNC flush, 1 KiB, "
             f"{t.duration_s:g} s after {t.warmup_s:g} s warm-up, a fresh broker per run.", ""]
    for n in producers:
        lines += _profile(out_dir, t, n, doc, log)
    name = "summary.txt" if tuple(producers) == (1, 8) else f"summary-{'-'.join(map(str, producers))}p.txt"
    summary = out_dir / name
    summary.write_text("\n".join(lines) + "\n")
    doc["summary_file"] = _rel(summary)
    log("\n".join(lines))
    return doc


def _profile(out_dir: Path, t, n: int, doc: dict, log) -> list[str]:
    """The three py-spy runs for n producers; returns the summary lines."""
    raw = out_dir / f"tx-{n}p.txt"
    log(f"[profile] {n} producer(s): Python frames (py-spy --nonblocking, raw)")
    r = network.run(_spec(t, f"profile-tx-{n}p", n, str(raw)), 1, log=log)["runs"][0]
    top = suite.top_frames(str(raw), 25) if raw.exists() else {}
    raw.unlink(missing_ok=True)
    doc["runs"].append({"producers": n, "kind": "python", "cpu": r["cpu"], "ops_per_s": r["ops_per_s"], "top": top})
    lines = [f"######## {n} producer(s)",
             f"== 1. Python frames (--nonblocking, 250/s, idle excluded): {_cpu_line(r)}; "
             f"{top.get('samples', 0)} samples", "self % (the frame running when sampled):"]
    lines += [f"  {p:5.1f}  {fn}" for fn, p in top.get("self_pct", [])]
    lines += ["inclusive % (the frame or anything it called):"]
    lines += [f"  {p:5.1f}  {fn}" for fn, p in top.get("inclusive_pct", []) if p < 99] + [""]

    svg = out_dir / f"tx-{n}p.svg"
    log(f"[profile] {n} producer(s): flamegraph (py-spy --nonblocking, SVG)")
    r = network.run(_spec(t, f"profile-tx-{n}p-svg", n, str(svg)), 1, log=log)["runs"][0]
    doc["runs"].append({"producers": n, "kind": "flamegraph", "cpu": r["cpu"], "ops_per_s": r["ops_per_s"],
                        "file": _rel(svg) if svg.exists() else None})
    lines += [f"== 2. flamegraph: {svg.name} ({_cpu_line(r)})", ""]

    nat = out_dir / f"tx-{n}p-native.txt"
    log(f"[profile] {n} producer(s): native frames (py-spy --native, raw)")
    with BrokerProcess("ASYNC") as b:
        cmd = [PYSPY, "record", "--pid", str(b.pid), "--native", "--rate", "100", "--format", "raw",
               "--duration", str(int(t.warmup_s + t.duration_s + 1)), "--output", str(nat)]
        spy = track(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            with shared_broker(b):
                r = network.run(_spec(t, f"profile-tx-{n}p-native", n), 1, log=log)["runs"][0]
            spy.wait(timeout=60)
        finally:
            if spy.poll() is None:
                spy.kill()
                spy.wait()
            untrack(spy)
    groups = native_groups(str(nat)) if nat.exists() else {}
    ntop = suite.top_frames(str(nat), 15) if nat.exists() else {}
    nat.unlink(missing_ok=True)
    doc["runs"].append({"producers": n, "kind": "native", "cpu": r["cpu"], "ops_per_s": r["ops_per_s"],
                        "groups": groups, "top": ntop, "command": " ".join(cmd)})
    lines += [f"== 3. native frames (--native, 100/s, pauses the broker per sample; covers warm-up and window): "
              f"{_cpu_line(r)}; {groups.get('samples', 0)} samples, {groups.get('idle_pct_of_samples')}% of them "
              f"waiting in epoll", "where the busy samples were (leaf frame, grouped):"]
    lines += [f"  {p:5.1f}  {g}" for g, p in groups.get("busy_pct", [])]
    lines += ["inclusive % of the busy samples, Python and libc frames (the frame or anything it called):"]
    lines += [f"  {p:5.1f}  {fn}" for fn, p in groups.get("busy_inclusive_pct", [])[:25]]
    lines += ["self % of all samples, top native frames:"]
    lines += [f"  {p:5.1f}  {fn}" for fn, p in ntop.get("self_pct", [])] + [""]
    return lines


if __name__ == "__main__":  # stand-alone: .venv/bin/python bench/compare_profile.py OUT_DIR [--quick] [--producers 1,8]
    sys.path.insert(0, str(BENCH / "rocketmq"))
    import workloads as W
    tm = W.Timing.quick() if "--quick" in sys.argv else W.Timing(duration_s=10.0, warmup_s=5.0)
    ns = (1, 8)
    if "--producers" in sys.argv:
        ns = tuple(int(x) for x in sys.argv[sys.argv.index("--producers") + 1].split(","))
    run(Path(sys.argv[1]), tm, producers=ns)
