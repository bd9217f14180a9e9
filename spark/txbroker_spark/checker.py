"""The ledger checker: a long-lived process that joins a producer group and answers the broker's
check-backs for Spark jobs from the ledger.

    python -m txbroker_spark.checker --brokers HOST:PORT[,HOST:PORT] --group GROUP --ledger DIR \
        [--deadline-seconds 600] [--log-level INFO] \
        [--access-key KEY --secret-key-file FILE] [--tls-ca CA [--tls-cert CERT --tls-key KEY] [--tls-server-name N]]

A secured broker: the credentials need the producer group (its check-backs, and the ENDs that answer
them); without the flags they come from the environment as for the data source (TXBROKER_ACCESS_KEY,
TXBROKER_SECRET_KEY_FILE or TXBROKER_SECRET_KEY, TXBROKER_TLS_CA, ...; security.py). Refused
credentials or TLS at start end the checker at once (exit 2) naming the setting; refused later (the
secret rotated, say), it reads the secret file again and reconnects.

How a check-back about a half message is answered (the message's properties name its job):
  - the job (or micro-batch) has a decision: COMMITTED -> COMMIT if the transaction id is in the
    decision, else ROLLBACK (an attempt Spark discarded); ABORTED -> ROLLBACK;
  - no decision, and the driver is known dead (same host and boot, its JVM is gone) or the job is
    older than its deadline -> the checker records ABORTED first (exclusively: if the driver's
    commit got there first, that decision is used instead) and answers ROLLBACK;
  - otherwise UNKNOWN: the job is still running; the broker asks again at its next interval.
For a streaming query, "dead" means the query's latest driver is gone (a restarted query is alive
again and will commit the replayed batch itself), and the deadline counts from the later of the half
message's birth and that driver's start.

Run one checker per producer group next to the ledger (on Kubernetes: a Deployment mounting the same
volume as the driver). Keep the group's check settings such that check_max x check_interval exceeds
the jobs' deadline, or undecided transactions get parked before the deadline can resolve them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time

from txbroker.client import (
    AsyncTransactionProducer, BrokerError, ClientError, LocalTransactionState, TlsHandshakeError, TransactionListener,
)

from txbroker_spark.ledger import ABORTED, Decision, Ledger, identity_is_dead, now_ms
from txbroker_spark.options import P_BATCH, P_EPOCH, P_JOB, P_KIND, P_QUERY, OptionError, default_ledger
from txbroker_spark.security import BrokerSecurity, add_arguments, flag_message, from_args

log = logging.getLogger("txbroker_spark.checker")

S = LocalTransactionState


class LedgerResolver:
    """The decision logic, separate from the network so it can be tested on its own."""

    def __init__(self, ledger: Ledger, default_deadline_ms: int = 600_000):
        self.ledger = ledger
        self.default_deadline_ms = default_deadline_ms
        self.answers = {"COMMIT": 0, "ROLLBACK": 0, "UNKNOWN": 0}

    def resolve(self, txid: str, properties: dict, born_ms: int = 0) -> LocalTransactionState:
        state = self._resolve(txid, properties or {}, born_ms)
        self.answers[state.name] += 1
        return state

    @staticmethod
    def _from(d: Decision, txid: str) -> LocalTransactionState:
        return S.COMMIT if d.committed and d.includes(txid) else S.ROLLBACK

    def _resolve(self, txid: str, props: dict, born_ms: int) -> LocalTransactionState:
        kind = props.get(P_KIND)
        if kind == "batch":
            return self._batch(txid, props[P_JOB], born_ms)
        if kind == "stream":
            return self._stream(txid, props[P_QUERY], int(props[P_BATCH]), int(props[P_EPOCH]), born_ms)
        log.warning("transaction %s is not from a txbroker Spark job (properties %s): UNKNOWN", txid, props)
        return S.UNKNOWN

    def _batch(self, txid: str, job: str, born_ms: int) -> LocalTransactionState:
        led = self.ledger
        d = led.job_decision(job)
        if d is not None:
            return self._from(d, txid)
        start = led.job_start(job)
        reason = self._dead_or_expired(start, born_ms, start["created_ms"] if start else born_ms)
        if reason is None:
            return S.UNKNOWN
        mine = Decision(ABORTED, [], reason=reason, by="checker")
        d = led.decide_job(job, mine)
        if d is mine:  # recorded by this call (concurrent check-backs find it decided)
            log.warning("job %s aborted by the checker: %s", job, reason)
        return self._from(d, txid)

    def _stream(self, txid: str, query: str, batch: int, epoch: int, born_ms: int) -> LocalTransactionState:
        led = self.ledger
        d = led.batch_decision(query, batch, epoch)
        if d is not None:
            return self._from(d, txid)
        committed = led.committed_batch(query, batch)
        if committed is not None:
            # at another epoch, this epoch's ids are not in it; at this one, it was written since
            # the read above (the driver's commit racing this check): follow it
            at, d = committed
            return self._from(d, txid) if at == epoch else S.ROLLBACK
        driver = led.stream_driver(query)
        since = max(born_ms, driver["created_ms"] if driver else 0)
        reason = self._dead_or_expired(driver, born_ms, since)
        if reason is None:
            return S.UNKNOWN
        mine = Decision(ABORTED, [], reason=reason, by="checker")
        d = led.decide_batch(query, batch, epoch, mine)
        if d is mine:
            log.warning("query %s batch %d epoch %d aborted by the checker: %s", query, batch, epoch, reason)
        return self._from(d, txid)

    def _dead_or_expired(self, start: dict | None, born_ms: int, since_ms: int) -> str | None:
        if start is not None and identity_is_dead(start.get("driver")):
            drv = start["driver"]
            return f"driver JVM {drv.get('pid')} on {drv.get('host')} is gone"
        deadline = (start or {}).get("deadline_ms") or self.default_deadline_ms
        age = now_ms() - (since_ms or born_ms or now_ms())
        if age > deadline:
            return f"no decision after {age / 1000:.0f}s (deadline {deadline / 1000:.0f}s)"
        return None


class LedgerListener(TransactionListener):
    def __init__(self, resolver: LedgerResolver):
        self.resolver = resolver

    def execute_local_transaction(self, msg, arg):  # the checker never sends
        return S.UNKNOWN

    def check_local_transaction(self, msg) -> LocalTransactionState:
        state = self.resolver.resolve(msg.transaction_id, msg.properties, msg.born_timestamp)
        log.info("check-back %s (job %s): %s", msg.transaction_id, (msg.properties or {}).get(P_JOB, "?"), state.name)
        return state


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True if asked to stop meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
        return True
    except asyncio.TimeoutError:
        return False


def _refused(security: BrokerSecurity, e: Exception) -> OptionError | None:
    return security.refusal(e) if isinstance(e, (BrokerError, TlsHandshakeError)) else None


async def run(brokers: str, group: str, ledger_dir: str, deadline_ms: int, stop: asyncio.Event,
              keepalive_seconds: float = 5.0, security: BrokerSecurity | None = None) -> None:
    security = security or BrokerSecurity()
    ledger = Ledger(ledger_dir).ensure()
    resolver = LedgerResolver(ledger, deadline_ms)
    producer = AsyncTransactionProducer(group, brokers, LedgerListener(resolver), **security.client_kwargs())
    delay = 0.5
    while True:  # a checker outlives broker restarts: wait for one to answer
        try:
            await producer.start()
            break
        except ClientError as e:
            refused = _refused(security, e)
            if refused is not None:  # the same settings fail again: say which to fix, and stop
                await producer.close()
                raise refused from None
            log.warning("no broker yet (%s); retrying in %.1fs", e, delay)
            if await _wait(stop, delay):
                await producer.close()
                return
            delay = min(delay * 2, 5.0)
    log.info("checker ready: group %s on %s (%s), ledger %s, default deadline %.0fs", group, brokers,
             security.describe(), ledger.root, deadline_ms / 1000)
    print(f"checker ready group={group} brokers={brokers} ledger={ledger.root}", flush=True)
    try:
        # Check-backs arrive on the registered connection; if it drops (a broker restart), reconnect
        # (which registers the group again) within seconds instead of at the next 30 s heartbeat.
        while not await _wait(stop, keepalive_seconds):
            try:
                await producer.client.connection(time.monotonic() + producer.client.request_timeout)
            except ClientError as e:
                refused = _refused(security, e)
                if refused is None:
                    log.warning("broker connection lost (%s); retrying", e)
                    continue
                # e.g. the credentials were rotated: the mounted secret file may be updated after the
                # broker's credentials file, so read it again and keep trying
                log.error("the broker refused the checker: %s; reading the credentials again and retrying",
                          flag_message(refused))
                try:
                    producer.client.credentials = security.credentials()
                except OptionError as read_error:
                    log.error("%s", flag_message(read_error))
    finally:
        await producer.close()
        log.info("checker stopped; answers: %s", resolver.answers)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m txbroker_spark.checker",
                                description="Answer check-backs for txbroker Spark jobs from the ledger.")
    p.add_argument("--brokers", required=True, help="HOST:PORT[,HOST:PORT...] (the master first)")
    p.add_argument("--group", required=True, help="the producer group the Spark jobs publish as")
    p.add_argument("--ledger", default=default_ledger(), help="ledger directory (default: $TXBROKER_LEDGER or "
                                                              "~/.txbroker/ledger)")
    p.add_argument("--deadline-seconds", type=float, default=600.0,
                   help="roll back a job with no decision after this long, when its start record has no deadline "
                        "of its own (default 600)")
    p.add_argument("--log-level", default="INFO")
    add_arguments(p)
    args = p.parse_args(argv)
    security = from_args(args, p)  # a wrong path or certificate: exit 2 naming the flag
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def amain() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(args.brokers, args.group, args.ledger, int(args.deadline_seconds * 1000), stop, security=security)

    try:
        asyncio.run(amain())
    except OptionError as e:  # credentials or TLS refused: the setting to fix
        print(f"checker: {flag_message(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - one clear line for an operator
        print(f"checker: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
