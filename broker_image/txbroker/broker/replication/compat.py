"""Which brokers may replicate from which: the versions a subscription and its welcome carry.

A slave applies its master's log records as they are and keeps them in its own store, so it must
read every record the master writes: the master's store format must be one the slave reads. The
slave says which formats it reads (ReplicaSubscribe.reads) and the master which it writes
(ReplicaWelcome.store_format); each side checks, so the newer of the two refuses whatever the older
one knows. A refused pair stops replicating (the slave retries now and then, since either may be
replaced) and says so in both logs and in `replication.incompatible` of /api/v1/broker, where the
operator reads it (condition ReplicationCompatible, Event ReplicationIncompatible). It never
replicates what the slave would misread or fail on halfway (docs/upgrading.md).

Brokers before txbroker 0.2.0 send neither field: such a master wrote at most store format 5 (they
read 1 to 4, or 1 to 5), which this broker reads; such a slave may read only up to 4, so a master
refuses it unless it writes a format every one of them reads.
"""

from __future__ import annotations

from txbroker import __version__
from txbroker.protocol.bodies import ReplicaSubscribe, ReplicaWelcome
from txbroker.store.records import READABLE_FORMATS, STORE_FORMAT_VERSION

# The highest store format a broker that sends no versions (before 0.2.0) may write, and the formats
# every such broker reads.
UNVERSIONED_WRITES_AT_MOST = 5
UNVERSIONED_READS = frozenset({1, 2, 3, 4})


def formats(reads) -> str:
    """`1-5`, or `1, 3`: a set of store formats, for a message."""
    r = sorted(set(reads))
    if len(r) > 2 and r[-1] - r[0] + 1 == len(r):  # (never a list of the range: a peer sends any ints)
        return f"{r[0]}-{r[-1]}"
    return ", ".join(map(str, r))


def this_broker() -> str:
    return f"txbroker {__version__} (store format {STORE_FORMAT_VERSION}, reads {formats(READABLE_FORMATS)})"


def peer(version: str, store_format: int, reads=()) -> str:
    """How a message names the other side, from what it sent."""
    if not version:
        return "a txbroker before 0.2.0 (it sends no version)"
    return f"txbroker {version} (store format {store_format}" + (f", reads {formats(reads)})" if reads else ")")


def slave_refusal(req: ReplicaSubscribe) -> str:
    """On the master: why slave `req` may not replicate from this broker, or ""."""
    reads = frozenset(req.reads) if req.reads else UNVERSIONED_READS
    if STORE_FORMAT_VERSION in reads:
        return ""
    return (f"slave {req.slave_name} runs {peer(req.version, req.store_format, req.reads)} and cannot read the "
            f"store format {STORE_FORMAT_VERSION} records of this master, {this_broker()}; replication stopped "
            "before it could diverge. Upgrade the slave (slaves first, then a switchover: docs/upgrading.md)")


def master_refusal(master: str, welcome: ReplicaWelcome) -> str:
    """On the slave: why this broker may not replicate from `master`, which answered `welcome`, or ""."""
    writes = welcome.store_format or UNVERSIONED_WRITES_AT_MOST
    if writes in READABLE_FORMATS:
        return ""
    return (f"master {master} runs {peer(welcome.version, welcome.store_format)}, whose records this broker, "
            f"{this_broker()}, cannot read; replication stopped before it could diverge. Upgrade this broker "
            "(docs/upgrading.md)")
