"""The workload pod: chaos/workload.py's clients and chaos/reader.py's reader, run unchanged inside
the cluster (a pod of the broker image, this package mounted from a ConfigMap), steered by the
runner on the node through a small HTTP API, which also hands back the whole history at the end.

    python -m chaos.k8s.pod --seed N --bootstrap HOST:PORT[,HOST:PORT] [--route FILE] [--port 8080]

The clients bootstrap from BOOTSTRAP (the TxBroker's `<name>-master` Service: every group's master);
the reader and the samplers follow the groups of the route file, the operator's `<name>-route`
ConfigMap mounted into this pod (reread when the kubelet updates it).

    GET  /status    phase, operations so far, and whether the consumer groups took everything yet
    POST /stop      the producers stop sending (they keep answering check-backs)
    POST /done      the producers stop answering check-backs (the groups settled)
    POST /finish    the consumers, samplers and reader stop; the reader reads every group to its end
                    and everything still stored once more; then phase `finished`
    GET  /history   (finished) the history and the reader's record, gzipped JSON (record.py)
    POST /exit      the process ends

One adapter on the workload (CheckBacks): a check-back of a transaction whose local transaction never
ran is answered ROLLBACK, as an application would (`--checks-as-workload`: as chaos/workload.py
answers it, from the intended decision); every check-back answer is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import logging
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from chaos import workload
from chaos.k8s import record
from chaos.reader import Reader

log = logging.getLogger("chaos.k8s.pod")
DLQ = "%DLQ%" + workload.CONSUMER_GROUP


class RouteFile:
    """{group: [broker addresses]} of the mounted route, parsed again only when the file changes."""

    def __init__(self, path: str):
        self.path = path
        self.stamp: float | None = None
        self.groups: dict[str, list[str]] = {}

    def __call__(self) -> dict[str, list[str]]:
        try:
            stamp = os.stat(self.path).st_mtime
        except OSError:
            return dict(self.groups)
        if stamp != self.stamp:
            with open(self.path) as f:
                route = yaml.safe_load(f)
            self.groups = {g["name"]: list(g["addresses"]) for g in route["groups"]}
            self.stamp = stamp
        return dict(self.groups)


class CheckBacks:
    """An adapter on chaos/workload.py's listener (Decisions), which it leaves unchanged otherwise:
    records which transactions' local transaction ran and every check-back answer; and, unless
    `as_workload`, answers ROLLBACK for a transaction whose local transaction never ran, as an
    application with no record of it would. (The workload's own answer is the intended decision
    of any transaction it knows of, and it knows of one whose send raised before its local
    transaction ran, e.g. the home's half message stored but its answer lost: answering COMMIT
    for it commits the home's messages while its other groups' never were stored, which the
    checker rightly calls torn.)"""

    def __init__(self, as_workload: bool = False):
        self.as_workload = as_workload
        self.ran: set[str] = set()
        self.answers: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self._execute = workload.Decisions.execute_local_transaction
        self._check = workload.Decisions.check_local_transaction

    def install(self) -> None:
        adapter = self

        def execute_local_transaction(listener, msg, arg):
            with adapter.lock:
                adapter.ran.add(arg[0])
            return adapter._execute(listener, msg, arg)

        def check_local_transaction(listener, msg):
            txid = msg.transaction_id
            with adapter.lock:
                ran = txid in adapter.ran
            answer = adapter._check(listener, msg)
            if not ran and not adapter.as_workload:
                answer = workload.S.ROLLBACK
            with adapter.lock:
                adapter.answers.setdefault(txid, []).append(answer.name + ("" if ran else " (never ran)"))
            return answer

        workload.Decisions.execute_local_transaction = execute_local_transaction
        workload.Decisions.check_local_transaction = check_local_transaction

    def dump(self) -> dict:
        with self.lock:
            return {"ran": len(self.ran), "answers": dict(self.answers),
                    "never_ran_answered": {k: v for k, v in self.answers.items() if k not in self.ran},
                    "as_workload": self.as_workload}


def consumed_everything(h: workload.History, reader: Reader) -> bool:
    """chaos/schedule.py's `_consumed_everything` (not importable here: it imports the operator):
    chaos-cg took everything Orders holds but poison, the poison reached the dead letters, chaos-ord
    took every acknowledged ordered send."""
    orders = set(reader.bodies("Orders"))
    dead = set(reader.bodies(DLQ))
    with h.lock:
        ordered = {k for k, tx in h.txs.items() if tx.kind == "ordered" and tx.acked == "COMMIT"}
        consumed_ordered = {f"ord-{k}-{n}" for k, seqs in h.ordered_deliveries.items() for n in seqs}
        return orders - h.poison <= set(h.consumed) and (orders & h.poison) <= dead and ordered <= consumed_ordered


class Run:
    def __init__(self, seed: int, bootstrap: list[str], route: str, checks: CheckBacks):
        self.seed, self.bootstrap, self.checks = seed, bootstrap, checks
        self.h = workload.History()
        self.groups_now = RouteFile(route)
        self.reader = Reader(self.groups_now)
        self.stop, self.done, self.consumers_done = threading.Event(), threading.Event(), threading.Event()
        self.phase = "loading"
        self.read_whole: bool | None = None
        self.history: bytes | None = None
        self.load = threading.Thread(target=self._load, daemon=True)
        self.error = ""

    def _load(self) -> None:
        try:
            workload.run(self.bootstrap, self.groups_now, self.h, self.reader, self.stop, self.done, self.seed,
                         self.consumers_done)
        except BaseException as e:  # noqa: BLE001 - reported through /status, the runner decides
            log.exception("the workload failed")
            self.error = f"workload: {type(e).__name__}: {e}"

    def status(self) -> dict:
        with self.h.lock:
            txs = len(self.h.txs)
            commits, failures, consumed = len(self.h.commits), len(self.h.failures), len(self.h.consumed)
        out = {"phase": self.phase, "txs": txs, "commits": commits, "failures": failures, "consumed": consumed,
               "positions_read": len(self.reader.seen), "error": self.error, "read_whole": self.read_whole,
               "load_alive": self.load.is_alive()}
        if self.stop.is_set() and self.phase in ("stopped", "done"):
            out["consumed_everything"] = consumed_everything(self.h, self.reader)
        return out

    def finish(self) -> None:
        self.phase = "finishing"
        self.done.set()
        self.consumers_done.set()
        self.load.join(60)
        try:
            self.read_whole = asyncio.run(self.reader.catch_up(time.monotonic() + 90))
        except Exception as e:  # noqa: BLE001 - the runner reports it as the harness's
            log.exception("the final read failed")
            self.error = f"final read: {type(e).__name__}: {e}"
            self.read_whole = False
        d = record.dump(self.h, self.reader)
        d["read_whole"] = self.read_whole
        d["check_backs"] = self.checks.dump()
        d["load_joined"] = not self.load.is_alive()
        self.history = gzip.compress(json.dumps(d).encode())
        self.phase = "finished"


def serve(run: Run, port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/status":
                self._send(200, json.dumps(run.status()).encode())
            elif self.path == "/history" and run.history is not None:
                self._send(200, run.history, "application/gzip")
            else:
                self._send(404, b"{}")

        def do_POST(self):  # noqa: N802
            if self.path == "/stop":
                run.stop.set()
                run.phase = "stopped"
            elif self.path == "/done":
                run.done.set()
                run.phase = "done"
            elif self.path == "/finish":
                if run.phase not in ("finishing", "finished"):
                    threading.Thread(target=run.finish, daemon=True).start()
            elif self.path == "/exit":
                self._send(200, b"{}")
                os._exit(0)
            else:
                self._send(404, b"{}")
                return
            self._send(200, json.dumps(run.status()).encode())

        def log_message(self, *args):  # quiet: the runner polls /status often
            pass

    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--bootstrap", required=True, help="HOST:PORT[,HOST:PORT]")
    ap.add_argument("--route", default="/etc/txbroker-route/route.yaml")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--checks-as-workload", action="store_true",
                    help="answer check-backs as chaos/workload.py does, also for transactions whose local "
                         "transaction never ran (see CheckBacks)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    checks = CheckBacks(args.checks_as_workload)
    checks.install()
    run = Run(args.seed, args.bootstrap.split(","), args.route, checks)
    run.load.start()
    serve(run, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
