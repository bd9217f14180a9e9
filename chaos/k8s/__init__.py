"""The fault harness on the real node (tracker issue 30, item 4): schedules against an
operator-deployed TxBroker on the testbed's one-node Kubernetes cluster, judged by chaos/checker.py
over the whole history. `make chaos-k8s SEEDS=1-20`; see README.md here.

Kept free of imports: the workload pod imports `chaos.k8s.pod` and `chaos.k8s.record` from a
ConfigMap, with only the broker image's packages.
"""
