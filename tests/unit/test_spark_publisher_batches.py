"""A task's rows into transactions (txbroker_spark/publisher.py TaskPublisher.add): a transaction ends
at `batchSize` rows, or before the message that would take it over `maxBatchBytes` of bodies, the
same wherever Arrow's batches start and end, whether a whole batch is added at once or a message at
a time."""

from __future__ import annotations

import random

import pytest

from txbroker.protocol.bodies import Message

from txbroker_spark.options import WriteOptions
from txbroker_spark.publisher import TaskPublisher


class Recording(TaskPublisher):
    """The publisher's batching alone: what would be sent is recorded, nothing is (no broker)."""

    def __init__(self, o: WriteOptions):  # noqa: D107 - no client, no loop
        self.o = o
        self._pending, self._pending_bytes = [], 0
        self.sent: list[list[bytes]] = []

    def _flush(self) -> None:
        if self._pending:
            self.sent.append([m.body for m in self._pending])
        self._pending, self._pending_bytes = [], 0


def expected(bodies: list[bytes], rows: int, limit: int) -> list[list[bytes]]:
    """The rule, stated plainly."""
    out, cur, size = [], [], 0
    for b in bodies:
        if cur and size + len(b) > limit:
            out.append(cur)
            cur, size = [], 0
        cur.append(b)
        size += len(b)
        if len(cur) >= rows:
            out.append(cur)
            cur, size = [], 0
    return out + ([cur] if cur else [])


@pytest.mark.parametrize("rows,limit,seed", [(3, 1024, 1), (10, 5000, 2), (100, 20000, 3), (50, 100000, 4)])
def test_transactions_end_by_rows_or_bytes_wherever_batches_split(rows, limit, seed):
    rnd = random.Random(seed)
    sizes = [1, 10, 100] * 20 + [900, 3000, 25000, 60000]  # mostly small; some over the limit alone
    bodies = [bytes(rnd.choice(sizes)) for _ in range(5000)]
    pub = Recording(WriteOptions(brokers=["x:1"], topic="T", group="g", batch_size=rows, max_batch_bytes=limit))
    i = 0
    while i < len(bodies):
        n = rnd.choice([1, 7, 100, 1000])
        pub.add([Message("T", b) for b in bodies[i:i + n]])
        i += n
    pub._flush()
    assert pub.sent == expected(bodies, rows, limit)
    assert any(len(t) == rows for t in pub.sent) and any(len(t) < rows for t in pub.sent[:-1])  # both limits met
