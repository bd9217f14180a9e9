"""Names shared by the operator's modules (and by the Helm chart's RBAC rules)."""

GROUP = "txbroker.dev"
VERSION = "v1alpha1"
TXBROKER_PLURAL = "txbrokers"
TXBROKER_KIND = "TxBroker"
TXPRODUCERGROUP_PLURAL = "txproducergroups"
TXPRODUCERGROUP_KIND = "TxProducerGroup"

MANAGED_BY = "txbroker-operator"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_BROKER = "txbroker.dev/broker"      # the owning TxBroker's name
LABEL_ROLE = "txbroker.dev/role"          # master | slave; the <name>-master Service selects on it
LABEL_INDEX = "txbroker.dev/index"        # pod ordinal (within its broker group)
LABEL_GROUP = "txbroker.dev/group"        # the broker group: g0, g1, ... (a pod without it is g0's)

# On broker pods. The broker reads its start-up role from the role label and its master's address
# from this annotation (downward API env), so a restarted container starts in the role the operator
# last gave its pod, not the one it was created with.
ANNOTATION_MASTER = "txbroker.dev/master-address"
ANNOTATION_POD_SPEC = "txbroker.dev/pod-spec-hash"   # which TxBroker spec a pod was built from (rolling updates)

# On a TxBroker: "true" lets a scale-down remove a broker group that still holds undelivered messages
# or pending transactions (they are lost; an Event says so)
ANNOTATION_FORCE_SCALE_DOWN = "txbroker.dev/force-scale-down"
# On a TxBroker: a planned switchover, asked for by hand. Comma-separated, each a broker group
# ("g0": its master moves to its most caught-up slave in sync) or a broker pod ("orders-2": it
# becomes its group's master). The operator removes what it carried out (or refused: an Event says why).
ANNOTATION_SWITCHOVER = "txbroker.dev/switchover"

ROLE_MASTER = "master"
ROLE_SLAVE = "slave"

CLIENT_PORT = 10911      # wire protocol
ADMIN_PORT = 10912       # admin plane HTTP: /healthz, /readyz, /api/v1

DATA_DIR = "/data"
CONFIG_DIR = "/etc/txbroker"
CONFIG_FILE = "broker.toml"
CONTAINER_NAME = "broker"
# the cluster route (<name>-route ConfigMap), mounted whole (no subPath) so updates reach the file
ROUTE_DIR = "/etc/txbroker-route"
ROUTE_FILE = "route.yaml"
MAX_GROUPS = 16          # the CRD's maximum of spec.groups; the brokers' too
