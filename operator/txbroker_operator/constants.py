"""Names shared by the operator's modules (and by the Helm chart's RBAC rules)."""

GROUP = "txbroker.dev"
VERSION = "v1alpha1"
TXBROKER_PLURAL = "txbrokers"
TXPRODUCERGROUP_PLURAL = "txproducergroups"

MANAGED_BY = "txbroker-operator"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_BROKER = "txbroker.dev/broker"      # the owning TxBroker's name
LABEL_ROLE = "txbroker.dev/role"          # master | slave; the <name>-master Service selects on it
LABEL_INDEX = "txbroker.dev/index"        # pod ordinal

ROLE_MASTER = "master"
ROLE_SLAVE = "slave"

CLIENT_PORT = 10911      # wire protocol
ADMIN_PORT = 10912       # admin plane HTTP: /healthz, /readyz

DATA_DIR = "/data"
CONTAINER_NAME = "broker"
