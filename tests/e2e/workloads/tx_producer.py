"""A transactional producer that runs in a pod of the broker image (the tests mount it from a
ConfigMap): it knows the brokers only by ADDRESS (a Service's DNS name), commits COUNT
transactions of one message each to TOPIC, and prints `ACK <body>` for each commit the broker
acknowledged. When the broker behind the name goes away it connects again, as a user's producer
would; the check-back listener commits, so a transaction whose END was lost commits by check-back.
It stops early, cleanly, once /tmp/stop exists (`kubectl exec POD -- touch /tmp/stop`).

    python tx_producer.py ADDRESS TOPIC GROUP COUNT [PREFIX]
"""

import os
import sys
import time

from txbroker.client import ClientError, LocalTransactionState, Message, TransactionListener, TransactionProducer


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT


def main() -> None:
    address, topic, group, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    prefix = sys.argv[5] if len(sys.argv) > 5 else "m"
    n, failures = 0, 0
    while n < count and not os.path.exists("/tmp/stop"):
        try:
            with TransactionProducer(group, [address], Commit(), request_timeout=5) as producer:
                while n < count and not os.path.exists("/tmp/stop"):
                    body = f"{prefix}-{n}"
                    n += 1
                    r = producer.send_message_in_transaction(Message(topic, body.encode()), None)
                    if r.local_state is LocalTransactionState.COMMIT and not r.end_error:
                        print(f"ACK {body}", flush=True)
        except (ClientError, OSError) as e:
            failures += 1
            if failures % 20 == 1:   # a line per burst of failures, not per request
                print(f"RETRY after {failures} failures: {e}", flush=True)
            time.sleep(0.2)
    print(f"DONE {n}", flush=True)


if __name__ == "__main__":
    main()
