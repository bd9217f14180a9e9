"""Kopf operator for txbroker: turns TxBroker resources into broker Pods and Services.

Modules, one job each:

- ``constants``  API group, resource names, labels, ports
- ``manifests``  pure functions: TxBroker spec -> Pod / Service / PVC manifests
- ``kube``       the few Kubernetes API calls the operator makes (create-if-absent, list, delete, patch)
- ``status``     pure function: observed pods -> TxBroker status
- ``reconcile``  one level-triggered pass: make the cluster match a TxBroker, then report status
- ``handlers``   the Kopf registrations (TxBroker create/update/resume, pod events) and settings
- ``leadership`` leader election through a Lease: only the leader runs Kopf; a standby waits
- ``metrics``    the operator's own Prometheus metrics (passes, failovers, blocked failovers, leader)

Run it with ``kopf run --standalone --all-namespaces -m txbroker_operator.handlers`` (or
``python -m txbroker_operator``).
"""

__version__ = "0.2.0"
