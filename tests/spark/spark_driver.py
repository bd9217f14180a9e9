"""A Spark driver run as its own process by the tests (so it can be SIGKILLed at a hook point).

    python spark_driver.py batch  --brokers B --topic T --group G --rows N [--partitions P]
                                  [--master M] [--conf k=v ...] [--opt k=v ...]
    python spark_driver.py stream --brokers B --topic T --group G --input DIR --checkpoint DIR
                                  [--opt k=v ...]

Rows are {"id": i, "payload": "row-i"}; the body is the row as JSON (the default). Extra data source
options (--opt) carry the inject.* hooks.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["batch", "stream"])
    p.add_argument("--brokers", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--rows", type=int, default=100)
    p.add_argument("--payload", default="row-", help="each batch row's payload is this and its id")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--input")
    p.add_argument("--checkpoint")
    p.add_argument("--master", default="local[2,4]")
    p.add_argument("--conf", action="append", default=[])
    p.add_argument("--opt", action="append", default=[])
    args = p.parse_args()

    from txbroker_spark import local_session

    conf = dict(kv.split("=", 1) for kv in args.conf)
    spark = local_session("txbroker-test-driver", args.master, conf=conf, log_level="ERROR")
    opts = {"brokers": args.brokers, "topic": args.topic, "producerGroup": args.group, "batchSize": "10"}
    opts.update(dict(kv.split("=", 1) for kv in args.opt))
    if args.mode == "batch":
        df = spark.range(args.rows, numPartitions=args.partitions).selectExpr(
            "id", f"concat('{args.payload}', id) AS payload")
        df.write.format("txbroker").options(**opts).mode("append").save()
        print("BATCH DONE", flush=True)
    else:
        stream = (spark.readStream.schema("id LONG, payload STRING").option("maxFilesPerTrigger", 1)
                  .json(args.input))
        q = (stream.writeStream.format("txbroker").options(**opts).option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        print(f"STREAM DONE query={q.id} batches={q.lastProgress and q.lastProgress['batchId']}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
