"""The SYNC acknowledgement path's slave counting, alone: ReplicationLeader.replicated_lsn and
in_sync with two slaves in sync, as a master calls them on every slave acknowledgement and held
write; without a controller (every slave counts) and under one (the sync set's approved slaves).

    .venv/bin/python bench/ack_path_bench.py
    PYTHONPATH=<an older tree>/broker_image .venv/bin/python bench/ack_path_bench.py   # before
"""
import tempfile
import timeit
from types import SimpleNamespace
from txbroker.store.state import StateMachine
from txbroker.broker.replication.leader import ReplicaFeed, ReplicationLeader
from txbroker.broker.role import RoleState

def leader(controlled: bool):
    state = StateMachine(tempfile.mkdtemp(), False, lambda e: None)
    cfg = SimpleNamespace(replication_mode="SYNC", sync_replicas=1, replication_timeout_ms=1000,
                          replication_heartbeat_ms=60_000, broker_name="m", await_role_confirmation=controlled)
    ld = ReplicationLeader(SimpleNamespace(state=state, config=cfg, role=RoleState("master", lambda: 1)))
    for i, n in enumerate(("s1", "s2")):
        f = ReplicaFeed(object(), n, f"10.0.0.{i}:1", 100)
        f.live = True
        ld.feeds[i] = f
    if controlled:
        ld.approve(["s1", "s2"])
    return ld

for controlled in ((False, True) if hasattr(ReplicationLeader, "approve") else (False,)):
    ld = leader(controlled)
    best = min(timeit.repeat(lambda: (ld.replicated_lsn(), ld.in_sync()), number=200_000, repeat=7))
    print(f"{'under a controller' if controlled else 'no controller':20} {best / 200_000 * 1e9:7.0f} ns per ack (replicated_lsn + in_sync)")
