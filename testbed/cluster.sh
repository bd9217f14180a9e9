#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, all of it inside a network namespace of its own
# (the testbed's tool, not a test): etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kube-proxy, CoreDNS, a PersistentVolume provisioner, containerd + runc + CNI and a kubelet, with
# the project's images (testbed/images.sh) imported. Nothing listens outside the namespace.
#
#   testbed/cluster.sh up       build what is missing, then start it all (DIR/kubeconfig for kubectl)
#   testbed/cluster.sh down     stop it all; remove the namespaces it made
#   testbed/cluster.sh load     build the images that changed and load them into the running node
#   testbed/cluster.sh exec CMD run CMD inside the cluster's network (pods, Services and the API
#                               server are reached there; `exec bash` for a shell)
#   testbed/cluster.sh env      print the exports for a shell run through `exec`
#
# DIR is $TXBROKER_CLUSTER_DIR, by default ${TXBROKER_CACHE:-~/.cache/txbroker}/cluster.
# The network, as a cluster has it:
#   node        10.243.0.1 (on the namespace's loopback): the API server :6443, the kubelet :10250, CoreDNS :53
#   pods        10.244.0.0/24 on the bridge txb0 (CNI bridge + host-local + portmap)
#   Services    10.96.0.0/16 (kube-proxy, iptables); `kubernetes` is 10.96.0.1:443
# What containerd and the kubelet need beyond their defaults here is in ../shared/TESTBED.md
# ("A real node"); each setting below says why.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${TXBROKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/txbroker}"
DIR="${TXBROKER_CLUSTER_DIR:-$CACHE/cluster}"
NETNS="${TXBROKER_NETNS:-txb-node}"
NODE=txb-node
NODE_IP=10.243.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
SOCK="$DIR/containerd.sock"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
BIN="$(bash "$HERE/build.sh" bin)"
log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] ERROR: %s\n' "$*" >&2; exit 1; }

# nsenter, not `ip netns exec`: that remounts /sys, which hides the cgroup mounts from the kubelet
in_ns() { nsenter --net="/var/run/netns/$NETNS" "$@"; }

# spawn NAME CMD...: run CMD in the namespace, in a session of its own (so that `down` can signal
# its whole process group); its pid goes to DIR/pids, its output to DIR/logs/NAME.log
spawn() {
    local name="$1"; shift
    setsid bash -c 'echo "$1 $$" >> "$2"; shift 2; exec nsenter --net="/var/run/netns/$0" "$@"' \
        "$NETNS" "$name" "$DIR/pids" "$@" > "$DIR/logs/$name.log" 2>&1 < /dev/null &
}
pid_of() { awk -v n="$1" '$1 == n {print $2}' "$DIR/pids" 2>/dev/null | tail -1; }

wait_for() {  # wait_for WHAT PROCESS SECONDS CMD...: until CMD succeeds; fail naming PROCESS's log
    local what="$1" proc="$2" deadline=$((SECONDS + $3)); shift 3
    until "$@" >/dev/null 2>&1; do
        local pid; pid="$(pid_of "$proc")"
        if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$DIR/logs/$proc.log" >&2; die "$proc exited while waiting for $what"
        fi
        (( SECONDS < deadline )) || { tail -n 20 "$DIR/logs/$proc.log" >&2; die "timed out waiting for $what"; }
        sleep 0.2
    done
}

kc() { in_ns "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" "$@"; }

# ---------------------------------------------------------------------------------------------
# what the cluster is made of
# ---------------------------------------------------------------------------------------------

need_packages() {
    local missing=() cmd
    for cmd in containerd runc iptables nft conntrack; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
    [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
    [[ -x /bin/busybox ]] || missing+=(busybox-static)
    (( ${#missing[@]} == 0 )) && return
    [[ $(id -u) -eq 0 ]] || die "missing ${missing[*]}: the cluster needs root and Debian's packages"
    log "installing containerd, runc, CNI plugins, iptables, nftables, conntrack (Debian packages)"
    apt-get update -qq && apt-get install -y -qq --no-install-recommends containerd runc \
        containernetworking-plugins iptables nftables conntrack busybox-static >/dev/null
}

build_coredns() {  # a CoreDNS with the plugins a cluster's DNS needs (testbed/go/coredns)
    local out="$BIN/coredns" stamp; stamp="$(cat "$HERE/go/coredns/go.mod" "$HERE/go/coredns/main.go" | sha256sum | cut -c1-16)"
    [[ -x "$out" && "$(cat "$BIN/.stamp-coredns" 2>/dev/null)" == "$stamp" ]] && return
    log "building CoreDNS (about 2 min on 2 cores with cold Go caches)"
    (cd "$HERE/go/coredns" && GOFLAGS=-mod=mod nice -n 10 "${GO:-/usr/local/go/bin/go}" build -trimpath \
        -ldflags "-s -w" -o "$out.tmp" . ) && mv "$out.tmp" "$out"
    echo "$stamp" > "$BIN/.stamp-coredns"
}

POLICY_AGENT_IMAGE=docker.io/txbroker/kube-network-policies:v0.8.0
build_policy_agent() {  # kube-network-policies, built unchanged from its module, in an image of its own
    local out="$BIN/kube-network-policies" stamp
    stamp="$(cat "$HERE/go/kube-network-policies/go.mod" "$HERE/go/kube-network-policies/tools.go" | sha256sum | cut -c1-16)"
    if [[ ! -x "$out" || "$(cat "$BIN/.stamp-kube-network-policies" 2>/dev/null)" != "$stamp" ]]; then
        log "building kube-network-policies (about 3 min on 2 cores with cold Go caches)"
        (cd "$HERE/go/kube-network-policies" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 \
            "${GO:-/usr/local/go/bin/go}" build -trimpath -ldflags "-s -w" -o "$out.tmp" sigs.k8s.io/kube-network-policies/cmd)
        mv "$out.tmp" "$out"; echo "$stamp" > "$BIN/.stamp-kube-network-policies"
    fi
    POLICY_AGENT_TAR="$CACHE/images/kube-network-policies-$stamp.tar"
    if [[ ! -f "$POLICY_AGENT_TAR" ]]; then
        local ctr; ctr="$(buildah from scratch)"
        buildah copy --quiet "$ctr" "$out" /bin/kube-network-policies >/dev/null
        buildah config --entrypoint '["/bin/kube-network-policies"]' "$ctr"
        buildah commit --quiet "$ctr" "$POLICY_AGENT_IMAGE" >/dev/null
        buildah rm "$ctr" >/dev/null
        rm -f "$CACHE"/images/kube-network-policies-*.tar
        buildah push --quiet "$POLICY_AGENT_IMAGE" "docker-archive:$POLICY_AGENT_TAR.tmp:$POLICY_AGENT_IMAGE"
        mv "$POLICY_AGENT_TAR.tmp" "$POLICY_AGENT_TAR"
    fi
}

# The kubeflow Spark operator (for the chart's SparkApplication form): its command built unchanged from
# its module (go/spark-operator), in an image made as upstream's Dockerfile makes it: the Spark image
# (here our locally made base, testbed/images.sh) with the binary added, for the controller runs
# spark-submit itself. Its Helm chart and CRDs come from the same module, unchanged.
SPARK_OPERATOR_VERSION=2.5.0
SPARK_OPERATOR_IMAGE=docker.io/kubeflow/spark-operator:$SPARK_OPERATOR_VERSION
build_spark_operator() {
    local out="$BIN/spark-operator" stamp go="${GO:-/usr/local/go/bin/go}"
    local spark_base; spark_base="docker.io/apache/spark:$(sed -n 's/^pyspark==//p' "$ROOT/constraints.txt")-python3"
    stamp="$(cat "$HERE/go/spark-operator/go.mod" "$HERE/go/spark-operator/tools.go" | sha256sum | cut -c1-16)"
    if [[ ! -x "$out" || "$(cat "$BIN/.stamp-spark-operator" 2>/dev/null)" != "$stamp" ]]; then
        log "building the Spark operator $SPARK_OPERATOR_VERSION (about 4 min on 2 cores with cold Go caches)"
        (cd "$HERE/go/spark-operator" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 \
            "$go" build -trimpath -ldflags "-s -w" -o "$out.tmp" github.com/kubeflow/spark-operator/v2/cmd/operator)
        mv "$out.tmp" "$out"; echo "$stamp" > "$BIN/.stamp-spark-operator"
    fi
    local chart="$CACHE/spark-operator/v$SPARK_OPERATOR_VERSION/chart"
    if [[ ! -f "$chart/Chart.yaml" ]]; then
        local mod; mod="$(cd "$HERE/go/spark-operator" && GOFLAGS=-mod=mod "$go" list -m -f '{{.Dir}}' github.com/kubeflow/spark-operator/v2)"
        mkdir -p "$(dirname "$chart")" && rm -rf "$chart.tmp"
        cp -r "$mod/charts/spark-operator-chart" "$chart.tmp" && chmod -R u+w "$chart.tmp" && mv "$chart.tmp" "$chart"
    fi
    local key; key="$(cat "$BIN/.stamp-spark-operator"; buildah inspect --type image --format '{{.FromImageID}}' "$spark_base")"
    key="$(echo "$key" | sha256sum | cut -c1-16)"
    SPARK_OPERATOR_TAR="$CACHE/images/spark-operator-$key.tar"
    if [[ ! -f "$SPARK_OPERATOR_TAR" ]]; then
        local ctr; ctr="$(buildah from --pull=never "$spark_base")"
        buildah copy --quiet --chmod 0755 "$ctr" "$out" /usr/bin/spark-operator >/dev/null
        buildah config --entrypoint '["/usr/bin/spark-operator"]' --user 185:185 "$ctr"
        buildah commit --quiet "$ctr" "$SPARK_OPERATOR_IMAGE" >/dev/null
        buildah rm "$ctr" >/dev/null
        rm -f "$CACHE"/images/spark-operator-*.tar
        buildah push --quiet "$SPARK_OPERATOR_IMAGE" "docker-archive:$SPARK_OPERATOR_TAR.tmp:$SPARK_OPERATOR_IMAGE"
        mv "$SPARK_OPERATOR_TAR.tmp" "$SPARK_OPERATOR_TAR"
    fi
}

build() {
    need_packages
    bash "$HERE/build.sh" build
    build_coredns
    ARCHIVES="$(bash "$HERE/images.sh")"   # prints the archive of each image
    build_policy_agent
    build_spark_operator
}

pause_image() {  # the CRI sandbox image, made locally (nothing can be pulled): busybox's sleep
    local tar="$CACHE/images/pause.tar"
    [[ -f "$tar" ]] && { echo "$tar"; return; }
    local ctr; ctr="$(buildah from scratch)"
    buildah copy --quiet "$ctr" /bin/busybox /bin/busybox >/dev/null
    buildah config --entrypoint '["/bin/busybox", "sleep", "2147483647"]' "$ctr"
    buildah commit --quiet "$ctr" docker.io/txbroker/pause:3.10 >/dev/null
    buildah rm "$ctr" >/dev/null
    buildah push --quiet docker.io/txbroker/pause:3.10 "docker-archive:$tar.tmp:docker.io/txbroker/pause:3.10"
    mv "$tar.tmp" "$tar"; echo "$tar"
}

# ---------------------------------------------------------------------------------------------
# certificates and configuration
# ---------------------------------------------------------------------------------------------

cert() {  # cert NAME SUBJECT EXT: DIR/pki/NAME.{key,crt} signed by the cluster's CA
    local p="$DIR/pki"
    printf '%s\n' "$3" > "$p/$1.ext"
    openssl req -newkey rsa:2048 -nodes -keyout "$p/$1.key" -out "$p/$1.csr" -subj "$2" 2>/dev/null
    openssl x509 -req -in "$p/$1.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
        -out "$p/$1.crt" -days 7 -sha256 -extfile "$p/$1.ext" 2>/dev/null
}

kubeconfig() {  # kubeconfig FILE CERT-NAME
    cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: txbroker
  cluster: {server: "https://$NODE_IP:6443", certificate-authority: "$DIR/pki/ca.crt"}
users:
- name: $2
  user: {client-certificate: "$DIR/pki/$2.crt", client-key: "$DIR/pki/$2.key"}
contexts:
- name: txbroker
  context: {cluster: txbroker, user: $2, namespace: default}
current-context: txbroker
EOF
}

gen_pki() {
    local p="$DIR/pki" client='extendedKeyUsage=clientAuth'
    mkdir -p "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" -days 7 -sha256 \
        -subj "/CN=txbroker-cluster-ca" 2>/dev/null
    cert apiserver "/CN=kube-apiserver" "subjectAltName=IP:$NODE_IP,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,\
DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost
extendedKeyUsage=serverAuth"
    cert kubelet-serving "/CN=$NODE" "subjectAltName=IP:$NODE_IP,DNS:$NODE
extendedKeyUsage=serverAuth"
    cert admin "/O=system:masters/CN=cluster-admin" "$client"
    # the controller manager does every controller's work under its own identity
    # (--use-service-account-credentials=false), which only system:masters covers
    cert controller-manager "/O=system:masters/CN=system:kube-controller-manager" "$client"
    cert scheduler "/CN=system:kube-scheduler" "$client"
    cert kube-proxy "/CN=system:kube-proxy" "$client"
    cert kubelet "/O=system:nodes/CN=system:node:$NODE" "$client"
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
    cert coredns "/CN=system:coredns" "$client"
    cert provisioner "/CN=txbroker:provisioner" "$client"
    openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
    openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
    local n; for n in admin controller-manager scheduler kube-proxy kubelet coredns provisioner; do
        kubeconfig "$DIR/$n.kubeconfig" "$n"
    done
    cp "$DIR/admin.kubeconfig" "$DIR/kubeconfig"
}

write_configs() {
    mkdir -p "$DIR"/{cni,cni-ipam,pod-logs,kubelet,volumes}
    cat > "$DIR/containerd.toml" <<EOF
version = 2
root = "$DIR/containerd-root"
state = "$DIR/containerd-state"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/txbroker/pause:3.10"
  # this sandbox refuses lowering oom_score_adj: without this every pod sandbox fails
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$SNAPSHOTTER"   # pick_snapshotter: overlayfs where this kernel mounts it, else native
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false   # cgroupfs: cgroups v1, no systemd
        BinaryName = "/usr/sbin/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"   # Debian's containernetworking-plugins
    conf_dir = "$DIR/cni"
EOF
    # hairpinMode: a pod reaching itself through a Service's address gets its own packets back
    cat > "$DIR/cni/10-txbroker.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "txbroker", "plugins": [
  {"type": "bridge", "bridge": "txb0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$DIR/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
    echo "nameserver $NODE_IP" > "$DIR/resolv.conf"
    cat > "$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$SOCK
podLogsDir: $DIR/pod-logs
cgroupDriver: cgroupfs
failCgroupV1: false        # cgroups are v1 here
failSwapOn: false
cgroupsPerQOS: false       # no QoS cgroup hierarchy in this sandbox
# ...and with none, an in-place resize action dereferences the nil pod cgroup config and the kubelet
# panics (kubernetes/kubernetes#137993, fix open in #137999); it took a chaos schedule's node down
# when a force-deleted pod was recreated under the same name. Nothing here resizes pods in place.
featureGates: {InPlacePodVerticalScaling: false}
enforceNodeAllocatable: []
evictionHard: {}           # the host's disk is shared with everything else: no evictions by it
imageGCHighThresholdPercent: 100   # images cannot be pulled back once collected
address: $NODE_IP
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
tlsCertFile: $DIR/pki/kubelet-serving.crt
tlsPrivateKeyFile: $DIR/pki/kubelet-serving.key
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $DIR/pki/ca.crt}}
authorization: {mode: AlwaysAllow}
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: $DIR/resolv.conf
syncFrequency: 10s         # ConfigMap and Secret volumes follow changes within seconds, not a minute
# tests read whole topics through a consumer pod's log (60,000 orders are ~15 MB); at the default 10Mi
# the kubelet rotates it and kubectl logs shows only the part written after the rotation
containerLogMaxSize: 100Mi
EOF
    # conntrack: leave the namespace's sysctls as they are (kube-proxy would raise them)
    cat > "$DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $DIR/kube-proxy.kubeconfig}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
EOF
    cat > "$DIR/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $DIR/coredns.kubeconfig txbroker
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
EOF
}

# RBAC for the cluster's own components that no bootstrap role covers, and the default StorageClass
cluster_rbac() {
    kc apply -f "$HERE/manifests/cluster-components.yaml" >/dev/null
}

# NetworkPolicies are enforced by kube-network-policies (a pod on the node) through an nfqueue: it
# decides each new connection to or from a pod. Its own nftables rules need the kernel's nft
# `queue` expression, which this kernel lacks (CONFIG_NFT_QUEUE); the same hook is made here with
# iptables' NFQUEUE target, which it has: after DNAT (Services resolved to pods), before SNAT, new
# connections only, the node's root processes (the kubelet's probes, the agent itself) exempt, as
# in the agent's own rules. --queue-bypass: while the agent is not up, traffic passes.
policy_queue_rules() {
    local rule
    in_ns iptables -t mangle -N TXB-NETPOL
    in_ns iptables -t mangle -A POSTROUTING -j TXB-NETPOL
    for rule in "-m owner --uid-owner 0 -j RETURN" "-m conntrack --ctstate ESTABLISHED,RELATED -j RETURN" \
            "-s $POD_CIDR -j NFQUEUE --queue-num 100 --queue-bypass" "-d $POD_CIDR -j NFQUEUE --queue-num 100 --queue-bypass"; do
        # shellcheck disable=SC2086
        in_ns iptables -t mangle -A TXB-NETPOL $rule
    done
}

# ---------------------------------------------------------------------------------------------
# up / down
# ---------------------------------------------------------------------------------------------

up() {
    [[ $(id -u) -eq 0 ]] || die "the cluster needs root (network namespaces, containerd, the kubelet)"
    [[ -x "$PY" ]] || die "no Python at $PY: run 'make venv' first (the provisioner uses the project's packages)"
    [[ -s "$DIR/pids" ]] && down
    build
    mkdir -p "$DIR"
    rm -rf "$DIR"/{pki,etcd,logs,kubelet,containerd-state,cni-ipam,pod-logs,volumes}
    mkdir -p "$DIR/logs"; : > "$DIR/pids"
    trap 'rc=$?; if (( rc != 0 )); then down; fi' EXIT   # a failed start leaves nothing running
    pick_snapshotter; gen_pki; write_configs

    ip netns list | awk '{print $1}' > "$DIR/netns-before"
    ip netns add "$NETNS" 2>/dev/null || die "network namespace $NETNS exists: another cluster runs (down it first)"
    in_ns ip link set lo up
    # the node's address on the namespace's loopback (no dummy interfaces in this kernel): local to
    # the node, and reached by pods through their gateway, the bridge
    in_ns ip addr add "$NODE_IP/32" dev lo
    # a route for Service addresses, as a node's default route gives them: the node's own processes
    # (host-network pods) reach Services, which kube-proxy then translates
    in_ns ip route add "$SERVICE_CIDR" dev lo
    in_ns sysctl -qw net.ipv4.ip_forward=1
    in_ns sysctl -qw net.bridge.bridge-nf-call-iptables=1
    policy_queue_rules

    spawn etcd "$BIN/etcd" --name node --data-dir "$DIR/etcd" --unsafe-no-fsync --log-level warn \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster node=http://127.0.0.1:2380
    # a snapshot whose removal a killed containerd cut short (the native snapshotter renames it
    # rm-<id> first): nothing refers to it, and it holds a whole image copy
    rm -rf "$DIR/containerd-root/io.containerd.snapshotter.v1.native/snapshots"/rm-*
    spawn containerd containerd --config "$DIR/containerd.toml"
    wait_for etcd etcd 30 in_ns curl -sf http://127.0.0.1:2379/health

    spawn kube-apiserver "$BIN/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
        --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port 6443 \
        --tls-cert-file "$DIR/pki/apiserver.crt" --tls-private-key-file "$DIR/pki/apiserver.key" \
        --client-ca-file "$DIR/pki/ca.crt" --authorization-mode Node,RBAC --allow-privileged=true \
        --kubelet-client-certificate "$DIR/pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$DIR/pki/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority "$DIR/pki/ca.crt" --kubelet-preferred-address-types InternalIP \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$DIR/pki/sa.pub" --service-account-signing-key-file "$DIR/pki/sa.key" \
        --service-cluster-ip-range "$SERVICE_CIDR" --profiling=false --v 1
    wait_for "the API server" kube-apiserver 120 kc get --raw /readyz
    cluster_rbac

    spawn kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$DIR/controller-manager.kubeconfig" \
        --use-service-account-credentials=false --leader-elect=false --secure-port 0 --profiling=false \
        --service-account-private-key-file "$DIR/pki/sa.key" --root-ca-file "$DIR/pki/ca.crt" \
        --cluster-name txbroker --concurrent-gc-syncs 2 --v 1
    spawn kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$DIR/scheduler.kubeconfig" \
        --leader-elect=false --secure-port 0 --profiling=false --v 1
    spawn kube-proxy "$BIN/kube-proxy" --config "$DIR/kube-proxy.yaml" --v 1
    spawn coredns "$BIN/coredns" -conf "$DIR/Corefile"
    spawn provisioner "$PY" "$HERE/provisioner.py" --kubeconfig "$DIR/provisioner.kubeconfig" \
        --volumes "$DIR/volumes" --node "$NODE"

    wait_for containerd containerd 30 test -S "$SOCK"
    prune_runtime
    import_images "$(pause_image)" $ARCHIVES "$POLICY_AGENT_TAR" "$SPARK_OPERATOR_TAR"
    spawn kubelet "$BIN/kubelet" --config "$DIR/kubelet.yaml" --root-dir "$DIR/kubelet" \
        --kubeconfig "$DIR/kubelet.kubeconfig" --hostname-override "$NODE" --node-ip "$NODE_IP" --v 1
    wait_for "the node to be Ready" kubelet 120 kc wait --for=condition=Ready "node/$NODE" --timeout=2s
    wait_for "CoreDNS" coredns 60 in_ns curl -sf http://127.0.0.1:8181/ready
    wait_for "the default ServiceAccount" kube-controller-manager 60 kc get serviceaccount default
    kc apply -f "$HERE/manifests/kube-network-policies.yaml" >/dev/null
    wait_for "the NetworkPolicy agent" kubelet 120 kc -n kube-system rollout status daemonset/kube-network-policies --timeout=2s
    cat > "$DIR/env" <<EOF
export KUBECONFIG=$DIR/kubeconfig
export PATH=$BIN:\$PATH
EOF
    trap - EXIT
    log "up in network namespace $NETNS: API server https://$NODE_IP:6443, KUBECONFIG=$DIR/kubeconfig; logs in $DIR/logs"
}

# The snapshotter pods' root filesystems come from. overlayfs starts a container on its image's
# unpacked layers; native gives each container a whole copy of its image (1.3 GB for Spark's), and
# copying and removing those made containerd the busiest process of the e2e stage on a slow host
# (about half a core, and a Spark pod's start waited on the copy). The first machines here could
# not mount overlay, so native stays the fallback. TXBROKER_SNAPSHOTTER forces either.
pick_snapshotter() {
    SNAPSHOTTER="${TXBROKER_SNAPSHOTTER:-}"
    if [[ -z "$SNAPSHOTTER" ]]; then
        local probe="$DIR/overlay-probe"   # on the disk containerd's root is on
        rm -rf "$probe"; mkdir -p "$probe"/{lower,upper,work,merged}
        SNAPSHOTTER=native
        if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
                "$probe/merged" 2>/dev/null; then
            umount "$probe/merged"; SNAPSHOTTER=overlayfs
        fi
        rm -rf "$probe"
    fi
    [[ "$SNAPSHOTTER" == overlayfs || "$SNAPSHOTTER" == native ]] \
        || die "TXBROKER_SNAPSHOTTER is '$SNAPSHOTTER': it takes overlayfs or native"
    echo "$SNAPSHOTTER" > "$DIR/snapshotter"
    log "snapshotter: $SNAPSHOTTER"
}

import_images() {  # the node's runtime gets the images (as `kind load docker-image` does)
    local tar snapshotter
    snapshotter="$(cat "$DIR/snapshotter" 2>/dev/null || echo native)"   # the one containerd was started with
    for tar in "$@"; do ctr -a "$SOCK" -n k8s.io images import --snapshotter "$snapshotter" "$tar" >/dev/null; done
}

# What earlier sessions left in containerd's root, which the cache keeps for its images: their
# containers (the kubelet is new each session and never collects them; under native each holds a
# whole copy of its image), and image layers unpacked for the snapshotter this run does not use.
# Left alone they filled the disk within a few days of runs.
prune_runtime() {
    local ids keys key left=-1 unused=native
    [[ "$SNAPSHOTTER" == native ]] && unused=overlayfs
    ids="$(ctr -a "$SOCK" -n k8s.io containers ls -q)"
    [[ -z "$ids" ]] || ctr -a "$SOCK" -n k8s.io containers rm $ids >/dev/null
    # layers go child first: each pass removes the snapshots nothing is built on
    while keys="$(ctr -a "$SOCK" -n k8s.io snapshots --snapshotter "$unused" ls | awk 'NR > 1 {print $1}')"; do
        [[ -n "$keys" ]] || break
        (( left != $(wc -l <<< "$keys") )) || break   # no progress: leave the rest
        left=$(wc -l <<< "$keys")
        for key in $keys; do ctr -a "$SOCK" -n k8s.io snapshots --snapshotter "$unused" rm "$key" >/dev/null 2>&1 || true; done
    done
    log "runtime pruned: $(wc -w <<< "$ids") earlier containers removed"
}

down() {
    [[ -f "$DIR/pids" ]] || return 0
    # the kubelet first, so it does not restart what goes; then its pods' runtime, then the rest
    local name pid
    for name in kubelet provisioner coredns kube-proxy kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do
        pid="$(pid_of "$name")"; [[ -n "$pid" ]] && kill -TERM -- "-$pid" 2>/dev/null || true
    done
    sleep 1
    pkill -KILL -f "containerd-shim-runc-v2 .*$SOCK" 2>/dev/null || true
    # A container outlives its killed shim (runc gives it its own PID namespace; init adopts it):
    # its processes are found by containerd's cgroups (cgroupfs driver, parent k8s.io) and killed.
    local procs
    for procs in /sys/fs/cgroup/pids/k8s.io/*/cgroup.procs /sys/fs/cgroup/k8s.io/*/cgroup.procs; do
        [[ -f "$procs" ]] && xargs -r kill -KILL < "$procs" 2>/dev/null || true
    done
    while read -r name pid; do kill -KILL -- "-$pid" 2>/dev/null || true; done < "$DIR/pids"
    rmdir /sys/fs/cgroup/*/k8s.io/* /sys/fs/cgroup/k8s.io/* 2>/dev/null || true
    local m
    for m in $(awk -v d="$DIR" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do umount -l "$m" || true; done
    # the pods' own namespaces (CNI's cni-*) made since up: a killed containerd leaves them behind
    for ns in $(ip netns list | awk '{print $1}' | grep '^cni-' || true); do
        grep -qx "$ns" "$DIR/netns-before" 2>/dev/null || ip netns delete "$ns" 2>/dev/null || true
    done
    ip netns delete "$NETNS" 2>/dev/null || true
    rm -f "$DIR/pids" "$DIR/env"
    log "down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    build) build; echo "$ARCHIVES" ;;
    load) ARCHIVES="$(bash "$HERE/images.sh")"; import_images $ARCHIVES ;;
    exec) shift; in_ns "$@" ;;
    env) cat "$DIR/env" 2>/dev/null || die "no cluster is up (testbed/cluster.sh up)" ;;
    *) sed -n '2,19p' "$0" >&2; exit 2 ;;
esac
