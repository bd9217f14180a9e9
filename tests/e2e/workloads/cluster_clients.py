"""Clients of a TxBroker of several broker groups, run in a pod of the broker image (the tests mount
this from a ConfigMap): they know only BOOTSTRAP (the `<name>-master` Service's DNS name), fetch the
route from whichever master answers there, and reach every group's brokers by the route's pod DNS
names, as a user's clients in the cluster would.

    python cluster_clients.py produce BOOTSTRAP TOPIC GROUP COUNT PREFIX
        COUNT transactions of one message each (committed; check-back commits too), spread over the
        active groups in turn; prints `ACK <body>` per acknowledged commit
    python cluster_clients.py consume BOOTSTRAP TOPIC GROUP COUNT TIMEOUT
        a push consumer of consumer group GROUP; prints `GOT <body>` per message until COUNT distinct
        bodies or TIMEOUT seconds, lets its offsets be committed, prints `DONE <n>`
"""

import sys
import threading
import time

from txbroker.client import (
    ClientError, ClusterPushConsumer, ClusterTransactionProducer, ConsumeStatus, LocalTransactionState, Message,
    TransactionListener,
)


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT


def produce(bootstrap: str, topic: str, group: str, count: int, prefix: str) -> None:
    n, failures = 0, 0
    while n < count:
        try:
            with ClusterTransactionProducer(group, [bootstrap], Commit(), request_timeout=5) as producer:
                while n < count:
                    body = f"{prefix}-{n}"
                    r = producer.send_message_in_transaction(Message(topic, body.encode(), keys=body), None)
                    n += 1
                    if r.local_state is LocalTransactionState.COMMIT and not r.end_error:
                        print(f"ACK {body}", flush=True)
        except (ClientError, OSError) as e:
            failures += 1
            if failures % 20 == 1:
                print(f"RETRY after {failures} failures: {e}", flush=True)
            time.sleep(0.5)
    print(f"DONE {n}", flush=True)


def consume(bootstrap: str, topic: str, group: str, count: int, timeout: float) -> None:
    seen: set[str] = set()
    lock = threading.Lock()

    class Take:
        def consume_message(self, msgs, ctx):
            with lock:
                for m in msgs:
                    body = m.body.decode()
                    seen.add(body)
                    print(f"GOT {body}", flush=True)
            return ConsumeStatus.CONSUME_SUCCESS

    deadline = time.monotonic() + timeout
    with ClusterPushConsumer(group, [bootstrap], topic, Take(), rebalance_interval=1.0, offset_commit_interval=0.2):
        while time.monotonic() < deadline:
            with lock:
                if len(seen) >= count:
                    break
            time.sleep(0.2)
        time.sleep(2)   # the last offsets committed before the consumer goes
    print(f"DONE {len(seen)}", flush=True)


def main() -> None:
    mode, bootstrap, topic, group, count = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    if mode == "produce":
        produce(bootstrap, topic, group, count, sys.argv[6])
    else:
        consume(bootstrap, topic, group, count, float(sys.argv[6]))


if __name__ == "__main__":
    main()
