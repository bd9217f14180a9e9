"""The key index's keys (store/keys.py key_entries): for every keyed message of a record, one entry
per key it names, "<topic>\\0<key>\\0" then the record's LSN (8 bytes) and the message's index in
the record (4 bytes), big-endian; messages without keys have none. Records of more messages than
the packed indexes kept at hand (1,024) included."""

from __future__ import annotations

import random
import struct

import pytest

from txbroker.store.keys import key_entries


def plainly(lsn: int, runs, texts):
    topics = [topic for topic, _q, n in runs for _ in range(n)]
    return [(f"{topics[i]}\0{key}\0".encode() + struct.pack(">QI", lsn, i), i)
            for i, text in enumerate(texts) for key in text.split()]


@pytest.mark.parametrize("seed", range(4))
def test_each_key_of_each_message_has_its_entry(seed):
    rnd = random.Random(seed)
    for _ in range(60):
        n = rnd.choice([1, 2, 50, 1023, 1024, 1025, 3000])
        texts = [rnd.choice(["", "k", "a b", "  two  spaced ", "ü-%d" % i, "o-%09d" % i]) for i in range(n)]
        runs, start = [], 0
        while start < n:
            count = rnd.randint(1, n - start)
            runs.append((rnd.choice(["T", "Tö", "%RETRY%g"]), rnd.randrange(8), count))
            start += count
        lsn = rnd.getrandbits(63)
        assert key_entries(lsn, runs, texts) == plainly(lsn, runs, texts)
