"""Disk use over time under a steady load, with and without retention (figures, no pass/fail).

    .venv/bin/python bench/retention_bench.py                  # 60 s per case
    .venv/bin/python bench/retention_bench.py --seconds 20     # shorter

Each case runs a broker (ASYNC flush) and one producer sending 1 KiB messages in batches of 50
at a fixed rate, and samples the data directory's size every few seconds. With retention the
broker keeps `--retention-ms` (a short window, so that a minute shows the level) and checks every
second; RocksDB frees the space of deleted records when it compacts, so the curve levels off in
steps. Writes bench/results/retention-<stamp>.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker.common import RESULTS_DIR, BrokerProcess, RandomBodies, du, host_speed_ms, machine_info  # noqa: E402
from txbroker.client import AsyncProducer, Message  # noqa: E402


async def steady_load(address: str, rate: int, seconds: float, on_tick) -> int:
    bodies = RandomBodies(1024)  # incompressible, as a real payload mostly is
    sent = 0
    async with AsyncProducer("bench", address) as p:
        t0 = time.monotonic()
        next_tick = 0.0
        while (elapsed := time.monotonic() - t0) < seconds:
            due = int(elapsed * rate)
            while sent < due:
                await p.send([Message("Steady", bodies.next()) for _ in range(50)])
                sent += 50
            if elapsed >= next_tick:
                on_tick(elapsed, sent)
                next_tick += seconds / 12
            await asyncio.sleep(0.005)
    return sent


def run_case(name: str, extra: list[str], rate: int, seconds: float) -> dict:
    samples = []
    with BrokerProcess("ASYNC", extra=extra) as b:
        b.create_topic("Steady", 4)

        def tick(elapsed, sent):
            samples.append({"t": round(elapsed, 1), "sent": sent, "disk_mb": round(du(b.data_dir) / 1e6, 1)})
            print(f"  {name:16} t={elapsed:5.1f}s sent={sent:8,} disk={samples[-1]['disk_mb']:7.1f} MB", flush=True)

        sent = asyncio.run(steady_load(b.address, rate, seconds, tick))
        tick(seconds, sent)
        deleted = next((float(line.split()[-1]) for line in b.metrics_text().splitlines()
                        if line.startswith("txbroker_retention_deleted_records_total")), 0.0)
    return {"case": name, "args": extra, "rate_msgs_s": rate, "sent": sent, "deleted_records": deleted,
            "samples": samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rate", type=int, default=5_000, help="messages per second (1 KiB each)")
    ap.add_argument("--retention-ms", type=int, default=10_000)
    args = ap.parse_args()
    host = host_speed_ms()
    cases = [
        run_case("no retention", [], args.rate, args.seconds),
        run_case(f"retention {args.retention_ms / 1000:.0f}s",
                 ["--retention-ms", str(args.retention_ms), "--retention-check-interval-ms", "1000"],
                 args.rate, args.seconds),
    ]
    print(f"\n{'t (s)':>6} | " + " | ".join(f"{c['case']:>18}" for c in cases) + "   (disk MB)")
    for i in range(min(len(c["samples"]) for c in cases)):
        print(f"{cases[0]['samples'][i]['t']:6.1f} | " + " | ".join(f"{c['samples'][i]['disk_mb']:18.1f}" for c in cases))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = RESULTS_DIR / f"retention-{stamp}.json"
    out.write_text(json.dumps({"machine": machine_info(), "host_ms": host, "cases": cases}, indent=1))
    print(f"\nhost {host:.0f} ms; written {out}")


if __name__ == "__main__":
    main()
