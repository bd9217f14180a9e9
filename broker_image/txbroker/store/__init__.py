"""RocksDB storage: an append-only log of records, and the state derived from it.

Every change the broker makes is one log record (records.py). Applying a record (state.py) writes
the record and everything derived from it (queue indexes, transaction state) in one RocksDB
WriteBatch, so a crash never leaves a half-applied commit. Replication ships the same records.
"""
