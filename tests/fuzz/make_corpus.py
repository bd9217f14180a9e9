"""Write the seed inputs of tests/fuzz/corpus/ (valid frames of every request; the fuzzers mutate
them). Run once; the fuzzers add what they find, merged back with -merge=1 (README.md)."""

from __future__ import annotations

import hashlib
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from txbroker.protocol import bodies as b  # noqa: E402
from txbroker.protocol.codes import RequestCode as C  # noqa: E402
from txbroker.protocol.framing import encode_frame  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = [
    (C.SEND_MESSAGE, b.SendRequest("pg", [b.Message("T", b"hello", "TagA", "k1", {"a": "b"})])),
    (C.SEND_MESSAGE, b.SendRequest("pg", [b.Message("T", b"half"), b.Message("T2", b"two", queue_id=1)], "tx-seed")),
    (C.SEND_MESSAGE_SHARED, b.SendRequest("pg", [b.Message("T", b"a"), b.Message("T", b"b", properties={"o": "1"})],
                                          "tx-shared", properties={"job": "j1", "o": "0"})),
    (C.END_TRANSACTION, b.EndTransactionRequest("pg", "tx1", 1)),
    (C.END_TRANSACTION, b.EndTransactionRequest("pg", "tx1", 2, 3, True)),
    (C.PULL_MESSAGE, b.PullRequest("T", 0, 0, 32, 10, "cg", "TagA || TagB")),
    (C.HEARTBEAT, b.HeartbeatRequest("client", ["pg"], ["cg"])),
    (C.UNREGISTER_CLIENT, b.ConsumerListRequest("cg")),
    (C.GET_ROUTEINFO_BY_TOPIC, b.RouteRequest("T")),
    (C.UPDATE_AND_CREATE_TOPIC, b.CreateTopicRequest("T3", 3)),
    (C.VIEW_MESSAGE_BY_ID, b.ViewMessageRequest("00000000000000020000")),
    (C.GET_CONSUMER_LIST_BY_GROUP, b.ConsumerListRequest("cg")),
    (C.UPDATE_CONSUMER_OFFSET, b.CommitOffsetsRequest("cg", [b.QueueOffset("T", 0, 1)])),
    (C.QUERY_CONSUMER_OFFSET, b.QueryOffsetsRequest("cg", "T")),
    (C.CONSUMER_SEND_MSG_BACK, b.SendBackRequest("cg", "00000000000000020000", "T", 1)),
    (C.LOCK_BATCH_MQ, b.LockQueuesRequest("cg", "client", "T", [0, 1])),
    (C.UNLOCK_BATCH_MQ, b.LockQueuesRequest("cg", "client", "T", [0])),
    (C.SEARCH_OFFSET_BY_TIMESTAMP, b.SearchOffsetRequest("T", 0, 0)),
    (C.QUERY_MESSAGE, b.QueryByKeyRequest("T", "k1")),
    (C.REPLICATION_SUBSCRIBE, b.ReplicaSubscribe("slave", 1, 1, "127.0.0.1:1")),
    (C.REPLICATION_ACK, b.ReplicaAck(1, 1)),
    (C.SASL_AUTHENTICATE, b.SaslRequest("SCRAM-SHA-256", "n,,n=root,r=abcdefghijklmnop")),
    (C.SASL_AUTHENTICATE, b.SaslRequest("SCRAM-SHA-256", "c=biws,r=abc,p=cHJvb2Y=")),
]


def write(kind: str, data: bytes) -> None:
    d = os.path.join(HERE, "corpus", kind)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


def main() -> None:
    for code, body in SEEDS:
        raw = b.encode(body)
        frame = encode_frame(0, code, 1, raw)
        write("frames", b"\x00" + frame)
        write("frames", b"\x05" + frame + encode_frame(1, 0, 1, b.encode(b.ErrorBody("x"))))
        record = struct.pack(">HBH", code, 0, len(raw)) + raw
        write("handlers", b"\x01" + record)  # authenticated
        write("handlers", b"\x00" + record)  # not authenticated
    hb = b.encode(b.HeartbeatRequest("c", ["pg"]))
    write("handlers", b"\x07" + struct.pack(">HBH", C.HEARTBEAT, 0, len(hb)) + hb)
    print("seeds written to", os.path.join(HERE, "corpus"))


if __name__ == "__main__":
    main()
