"""txbroker: transactional messaging in the style of Apache RocketMQ, on RocksDB.

The package is laid out by part:
  protocol/  the wire format shared by broker and clients (codes, framing, bodies)
  store/     RocksDB storage: the replicated log and the state derived from it
  broker/    the broker process: data plane, admin plane, transactions, check-back
  client/    the Python client library users script against
  cli/       the `txbroker` command
"""

__version__ = "0.2.0"
