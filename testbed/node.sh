#!/usr/bin/env bash
# A real node on this machine (issue 16, in progress): containerd + runc + CNI + a kubelet, inside a
# network namespace of the testbed's own, running pods of the images testbed/images.sh built.
#
#   testbed/node.sh start       network namespace txb-node, containerd, the images imported, and a
#                               standalone kubelet (static pods from DIR/manifests; no API server yet)
#   testbed/node.sh exec CMD... run CMD inside the node's network namespace (pods are reached there)
#   testbed/node.sh stop        stop it all and remove the namespace
#
# DIR is $TXBROKER_NODE_DIR, by default ${TXBROKER_CACHE:-~/.cache/txbroker}/node. The kubelet binary comes from
# ${TXBROKER_CACHE}/node-bin (built from the pinned k8s.io/kubernetes module in tests/k8s/go/kube).
# What containerd and the kubelet need beyond their defaults here is in ../shared/TESTBED.md ("A real
# node"); each setting below says why.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${TXBROKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/txbroker}"
NETNS=txb-node
POD_SUBNET=10.244.0.0/24
log() { printf '[node] %s\n' "$*" >&2; }
die() { printf '[node] ERROR: %s\n' "$*" >&2; exit 1; }

cmd=${1:-}; shift || true
DIR="${TXBROKER_NODE_DIR:-$CACHE/node}"
SOCK="$DIR/containerd.sock"
# nsenter, not `ip netns exec`: that remounts /sys, which hides the cgroup mounts from the kubelet
in_ns() { nsenter --net="/var/run/netns/$NETNS" "$@"; }

pause_image() {  # the CRI sandbox image, made locally (nothing can be pulled): busybox's sleep
    local tar="$CACHE/images/pause.tar"
    [[ -f "$tar" ]] && { echo "$tar"; return; }
    local ctr; ctr="$(buildah from scratch)"
    buildah copy --quiet "$ctr" /bin/busybox /bin/busybox >/dev/null
    buildah config --entrypoint '["/bin/busybox", "sleep", "2147483647"]' "$ctr"
    buildah commit --quiet "$ctr" docker.io/txbroker/pause:3.10 >/dev/null
    buildah rm "$ctr" >/dev/null
    buildah push --quiet docker.io/txbroker/pause:3.10 "docker-archive:$tar:docker.io/txbroker/pause:3.10"
    echo "$tar"
}

write_configs() {
    mkdir -p "$DIR"/{cni,cni-ipam,manifests,pod-logs,kubelet,logs}
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
    snapshotter = "native"   # no overlay mounts inside this sandbox
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
    cat > "$DIR/cni/10-txbroker.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "txbroker", "plugins": [
  {"type": "bridge", "bridge": "txb0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$DIR/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
    cat > "$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $DIR/manifests
containerRuntimeEndpoint: unix://$SOCK
podLogsDir: $DIR/pod-logs
cgroupDriver: cgroupfs
failCgroupV1: false        # cgroups are v1 here
failSwapOn: false
cgroupsPerQOS: false       # no QoS cgroup hierarchy in this sandbox
enforceNodeAllocatable: []
evictionHard: {}
address: 127.0.0.1
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
EOF
}

build_kubelet() {  # from the same pinned k8s.io/kubernetes module as the control plane
    # shellcheck source=../tests/k8s/versions.env
    source "$HERE/../tests/k8s/versions.env"
    local bin="$CACHE/node-bin" vpkg=k8s.io/component-base/version
    [[ "$("$bin/kubelet" --version 2>/dev/null)" == "Kubernetes $K8S_VERSION" ]] && return
    log "building kubelet $K8S_VERSION (about 4 min on 2 cores with cold Go caches)"
    mkdir -p "$bin"
    (cd "$HERE/../tests/k8s/go/kube" && GOFLAGS=-mod=mod nice -n 10 "${GO:-/usr/local/go/bin/go}" build -trimpath \
        -ldflags "-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)" \
        -o "$bin/" k8s.io/kubernetes/cmd/kubelet)
}

start() {
    if ! command -v containerd >/dev/null || [[ ! -x /usr/lib/cni/bridge ]]; then
        log "installing containerd and the CNI plugins (Debian packages)"
        apt-get update -qq && apt-get install -y -qq --no-install-recommends containerd containernetworking-plugins \
            busybox-static >/dev/null
    fi
    build_kubelet
    ip netns list | awk '{print $1}' > "$DIR.netns-before" 2>/dev/null || true
    ip netns list | grep -qw "$NETNS" || { ip netns add "$NETNS"; in_ns ip link set lo up; }
    in_ns sysctl -qw net.ipv4.ip_forward=1
    write_configs
    # (nsenter execs the command, so $! is the daemon's own pid)
    nsenter --net="/var/run/netns/$NETNS" containerd --config "$DIR/containerd.toml" > "$DIR/logs/containerd.log" 2>&1 &
    echo $! > "$DIR/containerd.pid"
    for _ in $(seq 100); do [[ -S "$SOCK" ]] && break; sleep 0.1; done
    [[ -S "$SOCK" ]] || die "containerd did not start: $(tail -5 "$DIR/logs/containerd.log")"
    for tar in "$(pause_image)" "$CACHE"/images/broker-*.tar "$CACHE"/images/operator-*.tar; do
        [[ -f "$tar" ]] && ctr -a "$SOCK" -n k8s.io images import --no-unpack=false "$tar" >/dev/null
    done
    nsenter --net="/var/run/netns/$NETNS" "$CACHE/node-bin/kubelet" --config "$DIR/kubelet.yaml" --root-dir "$DIR/kubelet" \
        --hostname-override txb-node > "$DIR/logs/kubelet.log" 2>&1 &
    echo $! > "$DIR/kubelet.pid"
    log "node up in network namespace $NETNS: logs in $DIR/logs, static pods from $DIR/manifests"
}

stop() {
    for p in kubelet containerd; do
        [[ -f "$DIR/$p.pid" ]] && { kill "$(cat "$DIR/$p.pid")" 2>/dev/null || true; rm -f "$DIR/$p.pid"; }
    done
    sleep 1
    pkill -f "containerd-shim-runc-v2 .*$SOCK" 2>/dev/null || true
    for m in $(awk -v d="$DIR" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do umount -l "$m" || true; done
    # the pods' own namespaces (CNI's cni-*), made since start: a killed containerd leaves them
    for ns in $(ip netns list | awk '{print $1}' | grep '^cni-'); do
        grep -qx "$ns" "$DIR.netns-before" 2>/dev/null || ip netns delete "$ns"
    done
    ip netns list | grep -qw "$NETNS" && ip netns delete "$NETNS"
    log "node stopped"
}

case "$cmd" in
    start) start ;;
    stop) stop ;;
    exec) in_ns "$@" ;;
    *) die "usage: $0 start | stop | exec CMD..." ;;
esac
