"""Clients of a cluster of broker groups (protocol/cluster.py): bootstrap from any broker of it,
follow the route, and spread over its groups. Against a broker outside any cluster they behave as
the single-group clients they are built on.

    from txbroker.client import ClusterProducer, Message, hash_selector

    with ClusterProducer("orders-pg", "txbroker:10911") as p:          # any broker of the cluster
        p.send(Message("Orders", b"o1", keys="customer-7"), hash_selector)

Where each part lives:
    route.py        the route: fetched from a bootstrap broker, refreshed, newest version kept
    members.py      one single-group client per broker group, following the route
    placement.py    which group and queue a send's messages go to
    producer.py     AsyncClusterProducer, ClusterProducer
    transaction.py  AsyncClusterTransactionProducer, ClusterTransactionProducer (transactions that span groups)
    jobs.py         AsyncClusterJobCoordinator, ClusterJobCoordinator (jobs that span groups)
    consumer.py     AsyncClusterPushConsumer, ClusterPushConsumer
"""

from txbroker.client.cluster.consumer import AsyncClusterPushConsumer, ClusterPushConsumer
from txbroker.client.cluster.jobs import AsyncClusterJobCoordinator, ClusterJob, ClusterJobCoordinator
from txbroker.client.cluster.producer import AsyncClusterProducer, ClusterProducer
from txbroker.client.cluster.route import RouteBook
from txbroker.client.cluster.transaction import AsyncClusterTransactionProducer, ClusterTransactionProducer

__all__ = ["AsyncClusterJobCoordinator", "AsyncClusterProducer", "AsyncClusterPushConsumer", "ClusterJob",
           "ClusterJobCoordinator", "AsyncClusterTransactionProducer", "ClusterProducer",
           "ClusterPushConsumer", "ClusterTransactionProducer", "RouteBook"]
