"""Optional workload 5: single-message transactions from RocketMQ's Python client.

rocketmq-python-client (PyPI, pure Python over gRPC) talks to the RocketMQ *proxy*, so run.py starts
the peer with ``proxy=True`` (ProxyStartup -pm local: proxy and broker in one JVM). The client and
its dependencies (grpcio, protobuf, opentelemetry ...) go into their own virtualenv outside the
clone, ``~/.cache/txbroker/rocketmq-pyclient-venv``, so they cannot disturb the project's pinned
.venv; the exact versions are recorded in the results.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import venv
from pathlib import Path

from peer import RocketMQPeer, run_bounded
from workloads import Timing, parse_output

HERE = Path(__file__).resolve().parent
CLIENT_PIN = "rocketmq-python-client==5.1.2"
VENV = Path(os.environ.get("TXBROKER_CACHE", Path.home() / ".cache" / "txbroker")) / "rocketmq-pyclient-venv"


def ensure_venv() -> tuple[Path, list[str]]:
    py = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    if not (stamp.exists() and stamp.read_text().strip() == CLIENT_PIN):
        if not py.exists():
            venv.EnvBuilder(with_pip=True).create(VENV)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", CLIENT_PIN], check=True)
        stamp.write_text(CLIENT_PIN + "\n")
    freeze = subprocess.run([str(py), "-m", "pip", "freeze"], stdout=subprocess.PIPE, text=True).stdout.split()
    return py, freeze


def topic_message_count(mq: RocketMQPeer, topic: str) -> int | None:
    """Sum of the max offsets of the topic's queues (= messages stored in it), via mqadmin topicStatus."""
    r = mq.mqadmin("topicStatus", "-t", topic, check=False)
    total, seen = 0, False
    for line in r.stdout.splitlines():
        parts = line.split()
        # "#Broker Name  #QID  #Min Offset  #Max Offset  #Last Updated"
        if len(parts) >= 4 and parts[1].isdigit() and parts[2].isdigit() and parts[3].isdigit():
            total += int(parts[3])
            seen = True
    return total if seen else None


def run_all(mq: RocketMQPeer, timing: Timing, concurrencies=(1, 8, 32), log=print, on_entry=None) -> list[dict]:
    py, freeze = ensure_venv()
    out = []
    plan = [(8, True)] if timing.broker_warmup_s > 0 else []
    plan += [(n, False) for n in concurrencies]
    for n, is_warmup in plan:
        t_case = Timing(**{**timing.__dict__, "duration_s": timing.broker_warmup_s, "warmup_s": 0.5}) \
            if is_warmup else timing
        topic = f"PyTx_{'warmup_' if is_warmup else ''}c{n}_{int(time.time())}"
        # transactional messages through the proxy need a topic typed TRANSACTION (message-type check)
        mq.mqadmin("updateTopic", "-c", "DefaultCluster", "-t", topic, "-r", "8", "-w", "8",
                   "-a", "+message.type=TRANSACTION")
        cmd = [str(py), str(HERE / "pyclient_bench.py"), "--endpoint", mq.grpc_endpoint, "--topic", topic,
               "--concurrency", str(n), "--duration", str(t_case.duration_s), "--warmup", str(t_case.warmup_s),
               "--report", str(t_case.report_s)]
        log(f"[bench] py_tx_{'warmup_' if is_warmup else ''}c{n}: {shlex.join(cmd[1:])}")
        t0 = time.monotonic()
        rc, text = run_bounded(cmd, t_case.duration_s + t_case.warmup_s + 120,
                               on_line=lambda l: log("   " + l) if not l.startswith("RESULT") else None)
        result, series, _ = parse_output(text)
        series = [ln for ln in text.splitlines() if ln.startswith("STAT t=")]
        stored = None
        if result is not None:
            # END_TRANSACTION reaches the broker one-way from the proxy: give it a moment, then compare
            # what the client saw committed with what the topic holds
            time.sleep(2)
            stored = topic_message_count(mq, topic)
            result["topic_messages_stored"] = stored
            result["commits_match_stored"] = (stored == result.get("committed_total_incl_warmup"))
        e = {
            "workload": "warmup" if is_warmup else "5",
            "is_warmup": is_warmup,
            "name": f"py_client_tx_{'warmup_' if is_warmup else ''}c{n}",
            "flush": mq.flush,
            "broker_overrides": dict(mq.broker_overrides),
            "via": "rocketmq-python-client -> gRPC -> proxy (local mode, broker in the same JVM)",
            "command": shlex.join(cmd),
            "returncode": rc,
            "wall_s": round(time.monotonic() - t0, 2),
            "figures": result,
            "series": series,
            "client_venv_freeze": freeze,
            "loadavg_after": os.getloadavg(),
        }
        if result is None:
            e["error"] = "python client printed no RESULT line"
            e["output_tail"] = text[-4000:]
            log(f"[bench] py_tx_c{n}: FAILED rc={rc}\n{text[-2000:]}")
        out.append(e)
        if on_entry:
            on_entry(e)
    return out


if __name__ == "__main__":
    # stand-alone smoke test: .venv/bin/python bench/rocketmq/python_client.py [--quick]
    sys.path.insert(0, str(HERE))
    quick = "--quick" in sys.argv
    with RocketMQPeer(proxy=True) as mq:
        for e in run_all(mq, Timing.quick() if quick else Timing(), concurrencies=(1, 8) if quick else (1, 8, 32)):
            print(e["name"], e.get("error") or e["figures"])
