"""Push consumers: a group's members share a topic's queues and get messages handed to a listener.

Clustering (default): the queues of the topic (and of the group's retry topic %RETRY%<group>) are
divided among the live members, sorted, each taking an even share (RocketMQ's
AllocateMessageQueueAveragely); a membership change announced by the broker rebalances at once.
Offsets are committed to the broker. A message whose listener answers RECONSUME_LATER (or raises)
goes back to the broker for a later retry, and to %DLQ%<group> after `max_reconsume_times`.
Delivery is at-least-once: a member that dies may have consumed messages whose offsets were not
committed yet; another member gets them again.

Orderly: each queue is consumed by one worker at a time, under a broker-held queue lock renewed
while held; SUSPEND_CURRENT_QUEUE_A_MOMENT retries the same messages after a pause, so nothing
is reordered or skipped.

Broadcasting: every member consumes every queue; offsets are kept in a local file.

A failed request of a queue's loop (a pull refused or timed out, an offset commit) is retried after
a pause that doubles up to 10 s; it is logged once, then as a count of repeats every minute, and
counted in `consumer.stats`.

Where each part lives:
    consumer.py       AsyncPushConsumer (options, start, shutdown) and the blocking PushConsumer
    rebalance.py      which queues this member consumes (allocate_averagely), and where each starts
    pulling.py        each queue's pull loop
    consuming.py      handing messages to the listener, concurrently or orderly; sending back failures
    queue_locks.py    the broker-held queue locks of orderly consumption
    offsets.py        committed offsets: on the broker, or in a local file (broadcasting)
    process_queue.py  the state of one consumed queue, which all of the above share
    member.py         what they share about this member: group, client id, connection, running, stats
    retrying.py       back-off and rate-limited logging of retried requests
    structs.py        the listener's answers and context, the options' enums, the counters
"""

from txbroker.client.push.consumer import AsyncPushConsumer, PushConsumer
from txbroker.client.push.rebalance import allocate_averagely
from txbroker.client.push.structs import (
    ConsumeContext, ConsumeFrom, ConsumeOrderlyStatus, ConsumerStats, ConsumeStatus, MessageModel,
)

__all__ = [
    "AsyncPushConsumer", "ConsumeContext", "ConsumeFrom", "ConsumeOrderlyStatus", "ConsumerStats", "ConsumeStatus",
    "MessageModel", "PushConsumer", "allocate_averagely",
]
