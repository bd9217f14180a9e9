"""A broker group's controller: the operator's failover, as its own process, so that the nemesis can
kill it mid-failover as it kills an operator's leader.

    python -m chaos.controller --state <work>/g0.status.json --pods <work>/g0.pods.json

It does what the operator's reconcile does for failover (operator/txbroker_operator/broker_group.py),
with the operator's own decisions (`observe.observe`, `status.broker_entries`,
`failover.master_down_reason`, `decide_failover`, `fence_before_promotion`) and admin client, and in
the operator's order: the decision is saved in the status first (master, epoch), then every other
broker that answers is made to follow the successor, then the successor is promoted. A controller
that starts finds the decision in the status and finishes it, as the next operator leader does.

Two files, one writer each (JSON, replaced atomically so a reader never sees half of one):
  pods      written by the schedule's kubelet loop: per broker, its IP, index and readiness
  status    written here: master, epoch, masterUnavailableSince, brokers (as the operator's), the
            failovers it carried out and the decisions that blocked one
and beside the status `<status>.acting` (JSON lines): brokers seen acting as master at one epoch in
one look, for the checker's two-masters rule.

`--crash-at saved|fenced` ends this process (exit 137, as a SIGKILL would) at that step of its first
failover: after the decision is saved, or after the other brokers follow the successor and before
it is promoted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from pathlib import Path

from txbroker_operator import brokers, constants as c, failover, observe, status as op_status, sync_set

log = logging.getLogger("chaos.controller")
GRACE_SECONDS = 2.0
PASS_SECONDS = 0.3


def read_state(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_state(path: Path, state: dict) -> None:
    # a temporary file per thread: the kubelet loop and an added group's start write one pods file
    # at once in one process (seed 311: the second os.replace found the first had taken its file)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


class Controller:
    def __init__(self, status_path: Path, pods_path: Path, mode: str, crash_at: str = "", flush: str = "SYNC"):
        self.path, self.pods_path = status_path, pods_path
        self.acting_path = status_path.with_name(status_path.name + ".acting")
        # as a TxBroker's spec: the brokers' data survives their restarts (storage); the group's size
        # is the pods file's, read at each pass
        self.spec = {"replication": mode, "flush": flush, "storage": {"size": "the broker's directory"},
                     "failover": {"gracePeriodSeconds": GRACE_SECONDS}}
        self.access = brokers.PLAIN
        self.crash_at = crash_at

    # ---- the status, as the operator keeps it in the TxBroker -------------------------------------

    @property
    def status(self) -> dict:
        return read_state(self.path)

    def save(self, **fields) -> dict:
        st = {**self.status, **fields}
        write_state(self.path, st)
        return st

    def pods(self, master: str) -> list[dict]:
        out = []
        listed = read_state(self.pods_path)
        self.spec["replicas"] = len(listed)
        for name, p in sorted(listed.items()):
            out.append({"metadata": {"name": name, "labels": {c.LABEL_INDEX: str(p["index"]),
                                                              c.LABEL_ROLE: failover.role_for(name, master)}},
                        "status": {"podIP": p["ip"], "conditions": [{"type": "Ready", "status": str(p["ready"])}]}})
        return out

    def _crash(self, at: str) -> None:
        if self.crash_at == at:
            log.warning("crashing at %s, as planned", at)
            os._exit(137)

    # ---- one pass --------------------------------------------------------------------------------

    def pass_once(self) -> None:
        st = self.status
        master = st["master"]
        looked = time.time()
        members = observe.observe(self.pods(master), self.access)
        self._record_acting(members)
        st = self.save(brokers=op_status.broker_entries(members, master, st.get("brokers") or []))
        why = failover.master_down_reason(members, master)
        head = members.get(master)
        if why and head is not None and head.info is not None and not head.info.is_master \
                and st.get("deciding"):
            self.converge(members)  # a decision saved by a controller that died before carrying it out
            return
        if not why:
            if st.get("masterUnavailableSince"):
                self.save(masterUnavailableSince=None)
            self.converge(members)
            return
        since = st.get("masterUnavailableSince")
        if since is None:
            since = looked
            self.save(masterUnavailableSince=since)
            log.warning("master %s is not serving (%s)", master, why)
        decision = failover.decide_failover(self.spec, st, members, master, time.time() - since)
        if isinstance(decision, failover.Blocked):
            self.save(blocked={**(st.get("blocked") or {}),
                               decision.reason: (st.get("blocked") or {}).get(decision.reason, 0) + 1})
        if decision is None or isinstance(decision, failover.Blocked):
            self.converge(members)  # as the operator's pass does every time (a master that answers keeps its slaves)
            return
        failovers = [*(st.get("failovers") or []), {"at": time.time(), "from": master, "to": decision.successor,
                                                     "epoch": decision.epoch, "message": decision.message}]
        self.save(master=decision.successor, epoch=decision.epoch, masterUnavailableSince=None, deciding=True,
                  failovers=failovers, successorAt=decision.position())
        log.warning("failover: %s", decision.message)
        self._crash("saved")
        self.converge(observe.observe(self.pods(decision.successor), self.access))

    def converge(self, members: dict) -> None:
        """The brokers' roles follow the status: its master taken over if it is not master yet, every
        other broker following it."""
        st = self.status
        head = members.get(st["master"])
        try:
            if head is not None and head.info is not None and not head.info.is_master:
                head = self.take_over(head, members)
            if head is None or not head.alive_master:
                return
            if st.get("deciding"):
                self.save(deciding=False)
            if head.info.unconfirmed:   # started again as master: it is, by the status
                self.access.confirm(head.ip, head.info.epoch, sorted(sync_set.saved(st, head.info.epoch)))
                head.info = self.access.info(head.ip)   # its sync set as confirmed (keep reads it below)
                log.info("%s started again as master at epoch %d: confirmed", head.name, head.info.epoch)
            for m in members.values():
                if m is not head and m.info is not None and (m.info.is_master or m.info.master != head.address):
                    self.access.demote(m.ip, head.address, max(self.status["epoch"], head.info.epoch))
            approved = sync_set.keep(self.status, head, lambda s: self.save(syncSet=s),
                                     lambda epoch, slaves: self.access.put_sync_set(head.ip, epoch, slaves))
            if approved:  # (a group that never came up shows whether its slaves were ever approved)
                log.info("master %s now counts %s for SYNC writes (epoch %d)", head.name, ", ".join(approved),
                         head.info.epoch)
        except (brokers.Unreachable, brokers.BrokerError) as e:
            log.info("could not set broker roles (the next pass retries): %s", e)

    def take_over(self, head, members: dict):
        """As the operator's take_over: the others follow `head` first, then the most caught-up of
        those that were not masters is promoted."""
        epoch = self.status["epoch"]
        deposed, chosen = set(), head.info
        for m in failover.fence_before_promotion(members, head.name):
            if m.alive_master:
                deposed.add(m.name)
            self.access.demote(m.ip, head.address, epoch)
        for m in members.values():
            m.info = self.access.try_info(m.ip) if m.ip else None
        self._crash("fenced")
        best = failover.successor_after_fencing(members, head, chosen, deposed)
        if best is None:
            raise brokers.Unreachable(f"{head.name} does not answer now that the others follow it, and none "
                                      "that answers is as far as it was")
        if best is not head:
            log.warning("%s is ahead of %s: promoting it instead", best.name, head.name)
            self.save(master=best.name)
            head = best
        if head.info.epoch >= epoch:  # it has seen our epoch already (fenced): take a fresh one
            epoch = observe.highest_epoch(members, self.status) + 1
            self.save(epoch=epoch)
        counted = sync_set.before_promotion(members, head)
        self.save(syncSet={"epoch": epoch, "slaves": counted})
        head.info = self.access.promote(head.ip, epoch, counted)
        log.warning("%s promoted at epoch %d", head.name, epoch)
        return head

    def _record_acting(self, members: dict) -> None:
        acting: dict[int, list[str]] = {}
        for m in members.values():  # answering as master, not fenced, in this one look
            if m.info is not None and m.info.is_master and not m.info.fenced_by:
                acting.setdefault(m.info.epoch, []).append(m.name)
        if any(len(v) > 1 for v in acting.values()):
            with open(self.acting_path, "a") as f:
                f.write(json.dumps({"at": time.time(), "acting": acting}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description="a broker group's controller (the operator's failover)")
    ap.add_argument("--state", required=True, type=Path, help="the status file (read at start, written here)")
    ap.add_argument("--pods", required=True, type=Path, help="the pods file (the kubelet loop's)")
    ap.add_argument("--mode", choices=["SYNC", "ASYNC"], default="SYNC", help="replication")
    ap.add_argument("--flush", choices=["SYNC", "ASYNC"], default="SYNC")
    ap.add_argument("--crash-at", choices=["", "saved", "fenced"], default="")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ctl = Controller(args.state, args.pods, args.mode, args.crash_at, args.flush)
    while True:
        try:
            ctl.pass_once()
        except Exception:  # noqa: BLE001 - a pass failing must not end the controller
            log.exception("controller pass failed")
        time.sleep(PASS_SECONDS)


if __name__ == "__main__":
    raise SystemExit(main())
