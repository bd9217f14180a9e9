"""The broker process: data plane (connection.py, dispatch.py, processors/), admin plane (admin.py),
transactions (the transaction/ package), replication (replication/) and role changes (failover.py),
wired together in server.py."""
