"""Transactions that span both broker groups of a TxBroker, from a pod that knows only the bootstrap
Service: each is two messages, the first to group g0's queues and the second to g1's (a selector),
committed. One producer for the whole run, never rebuilt: a transaction that fails is reported and
the next one goes on, so a producer that needed a restart would show as failures to the end.

    python spanning_clients.py BOOTSTRAP TOPIC GROUP COUNT
        prints `ACK <txid>` for each acknowledged commit, `FAIL <txid> <error>` otherwise, `DONE`
"""

import sys
import time

from txbroker.client import ClientError, ClusterTransactionProducer, LocalTransactionState, Message, TransactionListener


class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT


def first_to_g0_second_to_g1(queue_count, msg, arg):
    return 0 if msg.body.startswith(b"a-") else queue_count - 1


def main() -> None:
    bootstrap, topic, group, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with ClusterTransactionProducer(group, [bootstrap], Commit(), request_timeout=10) as producer:
        for n in range(count):
            txid = f"span-{n}"
            msgs = [Message(topic, f"a-{txid}".encode()), Message(topic, f"b-{txid}".encode())]
            try:
                r = producer.send_message_in_transaction(msgs, None, txid, selector=first_to_g0_second_to_g1)
            except ClientError as e:
                print(f"FAIL {txid} {e}", flush=True)
                time.sleep(0.2)
                continue
            ok = r.send_status == "SEND_OK" and r.local_state is LocalTransactionState.COMMIT and not r.end_error
            print(f"ACK {txid} {','.join(r.groups)}" if ok else f"FAIL {txid} {r.send_status} {r.end_error}",
                  flush=True)
            time.sleep(0.1)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
