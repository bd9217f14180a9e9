"""Master/slave replication of the log.

The master ships log records, as written, to each subscribed slave (leader.py); a slave applies
them through the same code the master used (follower.py), so both derive the same state. Each
record batch is acknowledged by the slave once durable. In SYNC mode the master answers a write
only when enough slaves have acknowledged it; readers see it only then too.
"""
