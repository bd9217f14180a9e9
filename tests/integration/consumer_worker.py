"""A push consumer in its own process, for tests that SIGKILL consumers.

Prints one line per message its listener consumed: `<queue> <body>`, flushed at once, so the
test knows what this member consumed even if it is killed.
"""

import argparse
import signal
import sys
import threading

from txbroker.client import ConsumeStatus, PushConsumer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    args = ap.parse_args()
    lock = threading.Lock()

    def listener(msgs, ctx):
        with lock:
            for m in msgs:
                sys.stdout.write(f"{m.queue_id} {m.body.decode()}\n")
            sys.stdout.flush()
        return ConsumeStatus.CONSUME_SUCCESS

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    consumer = PushConsumer(args.group, args.broker, args.topic, listener, heartbeat_interval=0.5,
                            rebalance_interval=1.0, offset_commit_interval=0.2, long_poll_ms=500).start()
    print("READY", flush=True)
    done.wait()
    consumer.shutdown()


if __name__ == "__main__":
    main()
