"""Check-back scan and recovery with a large finished history (workload 4).

1. `generate` (own process): builds a store with the store API directly (StateMachine.append of
   HalfRecord + EndRecord pairs, awaiting durability every chunk): N finished transactions of one
   1 KiB message each (95 % committed, 5 % rolled back) and M pending ones spread evenly through the
   history, born an hour ago so they are due. It then exits WITHOUT closing the store (os._exit), as
   a kill -9 would, so the next open replays RocksDB's WAL.
2. `reopen` (twice, one process each): times StateMachine's open (recovery): first after that
   crash, then after a clean close.
3. subprocess broker: `txbroker broker --data-dir` on the same store, timed until /readyz answers
   (and the same for an empty store), then real AsyncTransactionProducer connections (their
   check_local_transaction answers UNKNOWN, which changes nothing) and `POST /api/v1/check-scan`.
4. `inprocess` (own process): builds `Broker(config)` in-process (another open, timed), registers producers whose connections encode the CHECK_TRANSACTION_STATE frame
   exactly as BrokerConnection.send_oneway does and drop it, and times `broker.check_service.scan()`:
   the first (cold) scan with all M due, the scan when none is due (the steady-state tick), and
   further scans with the clock moved on by one check interval each (M due again), and last a scan
   with no producer connected (deciding and recording the checks without reading or sending).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import msgspec
from common import PYTHON, BrokerProcess, RandomBodies, du, loadavg, track, untrack
from txbroker.client.admin import AdminClient

GROUPS = 4
PRODUCERS_PER_GROUP = 2
TOPIC = "BenchCheck"
QUEUES = 4


# ---- 1. generate -------------------------------------------------------------------------------

async def _generate(path: str, finished: int, pending: int, size: int, chunk: int) -> dict:
    from txbroker.protocol.bodies import Message
    from txbroker.protocol.codes import TransactionState
    from txbroker.store.records import EndRecord, HalfRecord, TopicRecord
    from txbroker.store.state import StateMachine

    def fatal(e):
        raise SystemExit(f"store failed: {e}")

    state = StateMachine(path, False, fatal)
    _, fut = state.append(TopicRecord(TOPIC, QUEUES))
    await fut
    bodies = RandomBodies(size)
    now = int(time.time() * 1000)
    old = now - 3_600_000
    total = finished + pending
    every = total // pending if pending else total + 1
    t0 = time.perf_counter()
    made_pending = 0
    fut = None
    for i in range(total):
        q = i % QUEUES
        txid = uuid.uuid4().hex
        group = f"bench-check-{i % GROUPS}"
        if pending and i % every == every - 1 and made_pending < pending:
            made_pending += 1
            _, fut = state.append(HalfRecord(txid, group, old, [Message(TOPIC, bodies.next(), queue_id=q)]))
        else:
            born = old + i // 1000  # history is old too; no matter, it is finished
            lsn, _ = state.append(HalfRecord(txid, group, born, [Message(TOPIC, bodies.next(), queue_id=q)]))
            if i % 20 == 7:
                _, fut = state.append(EndRecord(txid, lsn, TransactionState.ROLLBACK, born + 5, []))
            else:
                _, _, fut = state.append_to_queues([(TOPIC, q, 1)], lambda offsets: EndRecord(
                    txid, lsn, TransactionState.COMMIT, born + 5, offsets))
        if i % chunk == chunk - 1:
            await fut
    while made_pending < pending:  # rounding: top up at the end
        made_pending += 1
        _, fut = state.append(HalfRecord(uuid.uuid4().hex, f"bench-check-{made_pending % GROUPS}", old,
                                         [Message(TOPIC, bodies.next(), queue_id=0)]))
    await fut
    secs = time.perf_counter() - t0
    return {"finished": finished, "pending": state.pending_count, "generate_seconds": round(secs, 2),
            "transactions_per_s": round(total / secs), "log_records": state.next_lsn - 1}


def cmd_generate(args) -> int:
    out = asyncio.run(_generate(args.dir, args.finished, args.pending, args.size, args.chunk))
    out["store_bytes_before_reopen"] = du(args.dir)
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no close: the next open recovers as after kill -9


# ---- 2. in-process recovery and scan ----------------------------------------------------------

class SinkConnection:
    """Stands in for BrokerConnection: writable, and send_oneway encodes the frame as it does."""

    def __init__(self):
        from txbroker.protocol.bodies import encode
        from txbroker.protocol.framing import FLAG_ONEWAY, encode_frame
        self._encode, self._frame, self._flag = encode, encode_frame, FLAG_ONEWAY
        self.frames = 0
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def send_oneway(self, code: int, body) -> None:
        data = self._frame(self._flag, code, 0, self._encode(body))
        self.frames += 1
        self.bytes += len(data)


def _open_close(path: str) -> dict:
    from txbroker.store.state import StateMachine

    t0 = time.perf_counter()
    state = StateMachine(path, False, lambda e: None)
    wall = time.perf_counter() - t0
    pending = state.pending_count

    async def close():
        await state.close()

    asyncio.run(close())
    return {"seconds": round(wall, 3), "pending": pending}


async def _scans(broker, rounds: int) -> dict:
    from txbroker.broker.transaction.service import now_ms

    sinks = []
    for g in range(GROUPS):
        for _ in range(PRODUCERS_PER_GROUP):
            s = SinkConnection()
            broker.producers.heartbeat(s, [f"bench-check-{g}"])
            sinks.append(s)
    cs = broker.check_service
    interval = broker.settings.defaults.check_interval_ms
    state = broker.state
    out: dict = {}
    # one interval ahead: the subprocess-broker phase, which ran before, checked everything just now
    now = now_ms() + interval + 1000
    t0 = time.perf_counter()
    r = cs.scan(now)
    t1 = time.perf_counter()
    await state.drain()
    t2 = time.perf_counter()
    out["first_scan"] = {"seconds": round(r.seconds, 5), "wall_seconds": round(t1 - t0, 5),
                         "check_record_durable_after_s": round(t2 - t1, 5), "pending": r.pending,
                         "checked": r.checked, "parked": r.parked, "without_producer": r.without_producer}
    idle = []
    for _ in range(max(3, rounds)):
        r = cs.scan(now)
        idle.append(r.seconds)
        assert r.checked == 0, r
    out["idle_scan_seconds"] = {"best": min(idle), "median": sorted(idle)[len(idle) // 2], "runs": idle}
    due = []
    for k in range(1, rounds + 1):
        r = cs.scan(now + k * interval)
        await state.drain()
        due.append(r.seconds)
        if r.checked != out["first_scan"]["checked"]:
            out.setdefault("notes", []).append(f"round {k}: checked {r.checked}, parked {r.parked}")
    out["due_scan_seconds"] = {"best": min(due), "median": sorted(due)[len(due) // 2], "runs": due} if due else {}
    out["frames_sent"] = sum(s.frames for s in sinks)
    out["frame_bytes"] = sum(s.bytes for s in sinks)
    # the same scan with no producer connected: deciding and recording the checks (CheckRecord)
    # without reading the half messages or sending anything, to split the cost
    for s in sinks:
        broker.producers.remove(s)
    r = cs.scan(now + (rounds + 1) * interval)
    await state.drain()
    out["decide_only_scan"] = {"seconds": round(r.seconds, 5), "due": r.without_producer + r.checked}
    return out


def cmd_reopen(args) -> int:
    # One open per process: StateMachine.close() does not release RocksDB's LOCK while the
    # column-family handles are alive, so a second open in the same process fails (see README).
    out = _open_close(args.dir)
    out["store_bytes"] = du(args.dir)
    print(json.dumps(out), flush=True)
    return 0


def cmd_inprocess(args) -> int:
    out: dict = {}
    from txbroker.broker.config import BrokerConfig
    from txbroker.broker.server import Broker

    cfg = BrokerConfig(data_dir=args.dir, listen="127.0.0.1:0", admin_listen="127.0.0.1:0").validate()

    async def go():
        t0 = time.perf_counter()
        broker = Broker(cfg)
        out["broker_object_seconds"] = round(time.perf_counter() - t0, 3)
        out["broker_store_recovery_seconds"] = round(broker.state.recovery_seconds, 3)
        out.update(await _scans(broker, args.rounds))
        await broker.state.close()

    asyncio.run(go())
    print(json.dumps(out), flush=True)
    return 0


# ---- 3. a real broker process on the same store -----------------------------------------------

def subprocess_broker(path: str, expected_pending: int) -> dict:
    from txbroker.client import AsyncTransactionProducer, LocalTransactionState, TransactionListener

    out: dict = {}
    with BrokerProcess("ASYNC") as empty:
        out["ready_seconds_empty_store"] = round(empty.ready_seconds, 3)
    b = BrokerProcess("ASYNC", data_dir=path)
    try:
        b.start(timeout=600)
        out["ready_seconds_large_store"] = round(b.ready_seconds, 3)
        out["broker_command"] = " ".join(b.cmd)

        class Unknown(TransactionListener):
            def __init__(self):
                self.checks = 0

            def execute_local_transaction(self, msg, arg):
                return LocalTransactionState.UNKNOWN

            def check_local_transaction(self, msg):
                self.checks += 1
                return LocalTransactionState.UNKNOWN

        async def go():
            listeners = [Unknown() for _ in range(GROUPS * PRODUCERS_PER_GROUP)]
            producers = [AsyncTransactionProducer(f"bench-check-{i % GROUPS}", b.address, lst)
                         for i, lst in enumerate(listeners)]
            for p in producers:
                await p.start()
            loop = asyncio.get_running_loop()

            def post() -> dict:
                return msgspec.to_builtins(AdminClient(b.admin, timeout=60).check_scan())

            t0 = time.perf_counter()
            first = await loop.run_in_executor(None, post)
            rtt = time.perf_counter() - t0
            deadline = time.monotonic() + 30
            while sum(x.checks for x in listeners) < first["checked"] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            answered = time.perf_counter() - t0
            await asyncio.sleep(0.5)  # let the UNKNOWN answers reach the broker before closing
            second = await loop.run_in_executor(None, post)
            for p in producers:
                await p.close()
            return {"first_scan": first, "first_scan_http_seconds": round(rtt, 4),
                    "all_checks_answered_after_s": round(answered, 3),
                    "checks_received_by_producers": sum(x.checks for x in listeners),
                    "idle_scan": second}

        out.update(asyncio.run(go()))
    finally:
        b.stop()
    return out


def run(finished: int, pending: int, workdir: str, rounds: int = 5, log=print) -> dict:
    """The whole workload; the store is built in `workdir` (deleted by the caller)."""
    path = os.path.join(workdir, "store")
    me = os.path.abspath(__file__)
    result: dict = {"finished": finished, "pending": pending, "message_size": 1024, "loadavg_before": loadavg()}
    gen_cmd = [PYTHON, me, "generate", "--dir", path, "--finished", str(finished), "--pending", str(pending)]
    reo_cmd = [PYTHON, me, "reopen", "--dir", path]
    ins_cmd = [PYTHON, me, "inprocess", "--dir", path, "--rounds", str(rounds)]
    result["commands"] = [" ".join(gen_cmd), " ".join(reo_cmd), "(txbroker broker on the store; see subprocess)",
                          " ".join(ins_cmd)]
    log(f"  generating {finished:,} finished + {pending:,} pending transactions with the store API ...")
    result["generate"] = _child(gen_cmd)
    log(f"  generated in {result['generate']['generate_seconds']} s"
        f" ({result['generate']['transactions_per_s']:,} tx/s in-process); reopening ...")
    result["reopen_after_crash"] = _child(reo_cmd)
    result["reopen_after_clean_close"] = _child(reo_cmd)
    log(f"  reopen after crash {result['reopen_after_crash']['seconds']} s, after clean close"
        f" {result['reopen_after_clean_close']['seconds']} s; real broker process on the store ...")
    result["subprocess"] = subprocess_broker(path, pending)
    log("  in-process Broker(config) and check_service.scan() ...")
    result["inprocess"] = _child(ins_cmd)
    result["loadavg_after"] = loadavg()
    return result


def _child(cmd: list[str]) -> dict:
    p = track(subprocess.Popen(cmd, stdout=subprocess.PIPE))
    out, _ = p.communicate()
    untrack(p)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[2]} failed with exit code {p.returncode}")
    return json.loads(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--dir", required=True)
    g.add_argument("--finished", type=int, default=1_000_000)
    g.add_argument("--pending", type=int, default=1_000)
    g.add_argument("--size", type=int, default=1024)
    g.add_argument("--chunk", type=int, default=2000)
    g.set_defaults(fn=cmd_generate)
    r = sub.add_parser("reopen")
    r.add_argument("--dir", required=True)
    r.set_defaults(fn=cmd_reopen)
    i = sub.add_parser("inprocess")
    i.add_argument("--dir", required=True)
    i.add_argument("--rounds", type=int, default=5)
    i.set_defaults(fn=cmd_inprocess)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
