#!/usr/bin/env bash
# A real Kubernetes control plane for tests: etcd + kube-apiserver + kube-controller-manager (+ the
# local kubelet, tests/k8s/kubelet.py), built from pinned sources and cached outside the clone.
#
#   tests/k8s/testbed.sh build          build whatever binary is missing (kube-apiserver,
#                                       kube-controller-manager, kubectl, etcd, helm) into
#                                       $TXBROKER_K8S_BIN or ~/.cache/txbroker/k8s-bin/<k8s-version>/
#   tests/k8s/testbed.sh start [DIR]    start etcd, kube-apiserver, kube-controller-manager and the
#                                       local kubelet; state, logs, certificates and DIR/kubeconfig
#                                       live in DIR
#   tests/k8s/testbed.sh stop  [DIR]    stop everything `start` started in DIR
#   tests/k8s/testbed.sh env   [DIR]    print `export KUBECONFIG=... PATH=...` for a shell
#
# DIR defaults to $TXBROKER_TESTBED_DIR or ~/.cache/txbroker/testbed/default.
# Environment:
#   TXBROKER_K8S_BIN   a directory holding prebuilt kube-apiserver, kube-controller-manager, kubectl,
#                      etcd and helm: used as it is, nothing is built
#   TXBROKER_CACHE     cache root (default ~/.cache/txbroker)
#   TESTBED_KUBELET=0  start without the local kubelet
#   TESTBED_CONTROLLER_MANAGER=0  start without kube-controller-manager
#   TXBROKER_POD_NET=A.B  pod addresses A.B.K.N, not 127.77.K.N (a local range; see kubelet.py)
#   PYTHON             interpreter for the kubelet (default: the repo's .venv/bin/python)
#   GO                 go command (default: `go` on PATH, else /usr/local/go/bin/go)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${TXBROKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/txbroker}"
BIN="${TXBROKER_K8S_BIN:-$CACHE/k8s-bin/$K8S_VERSION}"
K8S_MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"

log() { printf '[testbed] %s\n' "$*" >&2; }
die() { printf '[testbed] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------

find_go() {
    if [[ -n "${GO:-}" ]]; then echo "$GO"; return; fi
    if command -v go >/dev/null 2>&1; then command -v go; return; fi
    if [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go; return; fi
    die "Go is needed to build the test control plane ($K8S_VERSION kube-apiserver and kube-controller-manager, etcd $ETCD_VERSION, \
helm $HELM_VERSION) and was not found. Install Go (https://go.dev/dl/ or your distribution's golang package; \
helm $HELM_VERSION and etcd $ETCD_VERSION need Go >= 1.26, which an older Go fetches by itself from the module \
proxy with the default GOTOOLCHAIN=auto) and put it on PATH (or set GO=/path/to/go), or set TXBROKER_K8S_BIN \
to a directory holding prebuilt kube-apiserver, kube-controller-manager, kubectl, etcd and helm binaries."
}

# Each binary is rebuilt when its --version or its build recipe (stamp file) differs from the pins.
# (outputs captured first: `cmd | grep -q` can SIGPIPE cmd, which pipefail reports as a failure)
KUBE_RECIPE="kube $K8S_VERSION ldflags-v1"
ETCD_RECIPE="etcd $ETCD_VERSION"
HELM_RECIPE="helm $HELM_VERSION k8s-1.$HELM_K8S_MINOR"
stamp_ok() { [[ -n "${TXBROKER_K8S_BIN:-}" ]] || [[ "$(cat "$BIN/.stamp-$1" 2>/dev/null)" == "$2" ]]; }
# The kube binaries share one recipe (version and ldflags) and one stamp; when the stamp matches,
# only the binaries missing or reporting another version are built (a cache from before
# kube-controller-manager joined the set gets just that one, not three relinks).
KUBE_BINS=(kube-apiserver kube-controller-manager kubectl kube-scheduler kube-proxy kubelet)
kube_bin_ok() {
    local out
    [[ -x "$BIN/$1" ]] || return 1
    if [[ "$1" == kubectl ]]; then
        out="$("$BIN/kubectl" version --client 2>/dev/null)"; [[ "$out" == *"Client Version: $K8S_VERSION"* ]]
    else
        out="$("$BIN/$1" --version 2>/dev/null)"; [[ "$out" == "Kubernetes $K8S_VERSION" ]]
    fi
}
kube_missing() {  # print the kube binaries to build
    local b
    for b in "${KUBE_BINS[@]}"; do
        if ! stamp_ok kube "$KUBE_RECIPE" || ! kube_bin_ok "$b"; then echo "$b"; fi
    done
}
have_kube() { [[ -z "$(kube_missing)" ]]; }
have_etcd() {
    [[ -x "$BIN/etcd" ]] && stamp_ok etcd "$ETCD_RECIPE" &&
        [[ "$("$BIN/etcd" --version 2>/dev/null)" == *"etcd Version: ${ETCD_VERSION#v}"* ]]
}
have_helm() {
    [[ -x "$BIN/helm" ]] && stamp_ok helm "$HELM_RECIPE" &&
        [[ "$("$BIN/helm" version --template '{{.Version}}' 2>/dev/null)" == "$HELM_VERSION" ]]
}

build() {
    if [[ -n "${TXBROKER_K8S_BIN:-}" ]]; then
        local missing=()
        for b in "${KUBE_BINS[@]}" etcd helm; do [[ -x "$BIN/$b" ]] || missing+=("$b"); done
        (( ${#missing[@]} == 0 )) || die "TXBROKER_K8S_BIN=$BIN lacks: ${missing[*]}"
        return 0
    fi
    if have_kube && have_etcd && have_helm; then return 0; fi
    mkdir -p "$BIN"
    # One build at a time (pytest-xdist workers, parallel `make test` runs): the others wait, then
    # find the binaries in place.
    exec 9>"$BIN/.build.lock"
    flock 9
    local go; go="$(find_go)"
    local t0=$SECONDS
    local tmp; tmp="$(mktemp -d "$BIN/.build.XXXXXX")"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    export GOFLAGS=-mod=mod   # go.sum is committed; -mod=mod lets a stale one be completed
    local kube; mapfile -t kube < <(kube_missing)
    if (( ${#kube[@]} )); then
        log "building ${kube[*]} $K8S_VERSION (first time: about 7-25 min on 2 cores) ..."
        local vpkg=k8s.io/component-base/version
        local ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$K8S_MINOR \
-X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
        (cd "$HERE/go/kube" && nice -n 15 "$go" build -trimpath -ldflags "$ldflags" -o "$tmp/" \
            "${kube[@]/#/k8s.io/kubernetes/cmd/}")
        local b; for b in "${kube[@]}"; do mv -f "$tmp/$b" "$BIN/"; done
        echo "$KUBE_RECIPE" > "$BIN/.stamp-kube"
    fi
    if ! have_etcd; then
        log "building etcd $ETCD_VERSION ..."
        (cd "$HERE/go/etcd" && nice -n 15 "$go" build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
        mv -f "$tmp/etcd" "$BIN/"
        echo "$ETCD_RECIPE" > "$BIN/.stamp-etcd"
    fi
    if ! have_helm; then
        log "building helm $HELM_VERSION ..."
        local hv=helm.sh/helm/v3/internal/version cu=helm.sh/helm/v3/pkg/chartutil lr=helm.sh/helm/v3/pkg/lint/rules
        (cd "$tmp" && GOFLAGS= GOBIN="$tmp" nice -n 15 "$go" install -trimpath \
            -ldflags "-s -w -X $hv.version=$HELM_VERSION -X $hv.gitTreeState=clean \
-X $cu.k8sVersionMajor=1 -X $cu.k8sVersionMinor=$HELM_K8S_MINOR -X $lr.k8sVersionMajor=1 -X $lr.k8sVersionMinor=$HELM_K8S_MINOR" \
            "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
        mv -f "$tmp/helm" "$BIN/"
        echo "$HELM_RECIPE" > "$BIN/.stamp-helm"
    fi
    have_kube && have_etcd && have_helm || die "built binaries in $BIN do not report the pinned versions"
    log "built into $BIN in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------------------------------------
# start / stop / env
# ---------------------------------------------------------------------------------------------

state_dir() { echo "${1:-${TXBROKER_TESTBED_DIR:-$CACHE/testbed/default}}"; }

find_python() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
    if [[ -x "$ROOT/.venv/bin/python" ]]; then echo "$ROOT/.venv/bin/python"; return; fi
    command -v python3 || die "no python3 for the local kubelet (set PYTHON)"
}

free_port() { "$PYTHON_BIN" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start NAME LOGFILE CMD... : run CMD in its own session, remember its pid in $DIR/pids
spawn() {
    local name="$1" logf="$2"; shift 2
    setsid "$@" >"$logf" 2>&1 < /dev/null &
    echo "$name $!" >> "$DIR/pids"
}

pid_of() { awk -v n="$1" '$1 == n {print $2}' "$DIR/pids" 2>/dev/null | tail -1; }

alive() { local p; p="$(pid_of "$1")"; [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; }

wait_for() {  # wait_for DESCRIPTION PROCESS-NAME TIMEOUT CMD...
    local what="$1" proc="$2" timeout="$3"; shift 3
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        alive "$proc" || { tail -n 30 "$DIR/logs/$proc.log" >&2 || true; die "$proc exited while waiting for $what"; }
        (( SECONDS < deadline )) || { tail -n 30 "$DIR/logs/$proc.log" >&2 || true; die "timed out after ${timeout}s waiting for $what"; }
        sleep 0.2
    done
}

gen_pki() {
    local p="$DIR/pki"; mkdir -p "$p"
    local o=(-days 7 -sha256)
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" "${o[@]}" \
        -subj "/CN=txbroker-testbed-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout "$p/apiserver.key" -out "$p/apiserver.csr" \
        -subj "/CN=kube-apiserver" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' > "$p/server.ext"
    openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
        -out "$p/apiserver.crt" "${o[@]}" -extfile "$p/server.ext" 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' > "$p/client.ext"
    # the admin: a client certificate in system:masters (cluster-admin through RBAC's bootstrap binding)
    client_cert admin "/O=system:masters/CN=testbed-admin"
    # the controller manager: its own name, so the apiserver's log tells its requests apart; in
    # system:masters too, because with --use-service-account-credentials=false this one identity does
    # every controller's work, which the bootstrap role system:kube-controller-manager does not grant
    client_cert kube-controller-manager "/O=system:masters/CN=system:kube-controller-manager"
    # service-account token signing key pair
    openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
    openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
}

client_cert() {  # client_cert NAME SUBJECT: DIR/pki/NAME.{key,crt}, signed by the testbed's CA
    local p="$DIR/pki"
    openssl req -newkey rsa:2048 -nodes -keyout "$p/$1.key" -out "$p/$1.csr" -subj "$2" 2>/dev/null
    openssl x509 -req -in "$p/$1.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
        -out "$p/$1.crt" -days 7 -sha256 -extfile "$p/client.ext" 2>/dev/null
}

write_kubeconfig() {  # write_kubeconfig FILE CERT-NAME USER: a kubeconfig using DIR/pki/CERT-NAME.{crt,key}
    local p="$DIR/pki"
    cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: testbed
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $p/ca.crt
users:
- name: $3
  user:
    client-certificate: $p/$2.crt
    client-key: $p/$2.key
contexts:
- name: testbed
  context: {cluster: testbed, user: $3, namespace: default}
current-context: testbed
EOF
}

start() {
    DIR="$(state_dir "${1:-}")"
    mkdir -p "$DIR"
    DIR="$(cd "$DIR" && pwd)"
    if [[ -s "$DIR/pids" ]]; then
        stop "$DIR"
    fi
    build
    PYTHON_BIN="$(find_python)"
    # a failed start leaves nothing running
    trap 'rc=$?; if (( rc != 0 )); then stop "$DIR"; fi' EXIT
    rm -rf "$DIR/etcd" "$DIR/pki" "$DIR/logs" "$DIR/pids"
    mkdir -p "$DIR/logs"
    : > "$DIR/pids"
    gen_pki

    local tries=0
    while :; do
        ETCD_PORT="$(free_port)"; ETCD_PEER_PORT="$(free_port)"
        spawn etcd "$DIR/logs/etcd.log" "$BIN/etcd" --name testbed --data-dir "$DIR/etcd" \
            --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
            --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
            --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
            --initial-cluster "testbed=http://127.0.0.1:$ETCD_PEER_PORT" \
            --unsafe-no-fsync --log-level warn
        if wait_for_quiet etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"; then break; fi
        # most likely a port taken between free_port and bind: try other ports
        tries=$((tries + 1)); (( tries < 3 )) || { tail -n 30 "$DIR/logs/etcd.log" >&2; die "etcd did not start"; }
        kill_proc etcd; sed -i '/^etcd /d' "$DIR/pids"; rm -rf "$DIR/etcd"
    done

    local curlk=(curl -sf --cacert "$DIR/pki/ca.crt" --cert "$DIR/pki/admin.crt" --key "$DIR/pki/admin.key")
    tries=0
    while :; do
        APISERVER_PORT="$(free_port)"
        spawn kube-apiserver "$DIR/logs/kube-apiserver.log" "$BIN/kube-apiserver" \
            --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
            --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
            --cert-dir "$DIR/pki" --tls-cert-file "$DIR/pki/apiserver.crt" --tls-private-key-file "$DIR/pki/apiserver.key" \
            --client-ca-file "$DIR/pki/ca.crt" \
            --authorization-mode RBAC \
            --service-account-issuer https://kubernetes.default.svc.cluster.local \
            --service-account-key-file "$DIR/pki/sa.pub" --service-account-signing-key-file "$DIR/pki/sa.key" \
            --service-cluster-ip-range 10.96.0.0/16 \
            --disable-admission-plugins ServiceAccount \
            --allow-privileged=true \
            --v 1
        if wait_for_quiet kube-apiserver 120 "${curlk[@]}" "https://127.0.0.1:$APISERVER_PORT/readyz"; then break; fi
        tries=$((tries + 1))
        if (( tries >= 3 )) || ! grep -q "address already in use" "$DIR/logs/kube-apiserver.log"; then
            tail -n 30 "$DIR/logs/kube-apiserver.log" >&2
            die "kube-apiserver did not become ready (log: $DIR/logs/kube-apiserver.log)"
        fi
        kill_proc kube-apiserver; sed -i '/^kube-apiserver /d' "$DIR/pids"
    done
    write_kubeconfig "$DIR/kubeconfig" admin testbed-admin

    # the controller manager and the kubelet come up side by side; each is waited for below
    local kcm="${TESTBED_CONTROLLER_MANAGER:-1}"
    if [[ "$kcm" != 0 ]]; then start_controller_manager; fi
    if [[ "${TESTBED_KUBELET:-1}" != 0 ]]; then
        rm -f "$DIR/kubelet/ready"   # a previous run's: it must not stand in for this kubelet's
        spawn kubelet "$DIR/logs/kubelet.log" "$PYTHON_BIN" "$HERE/kubelet.py" \
            --kubeconfig "$DIR/kubeconfig" --state-dir "$DIR/kubelet" --node-name "${TESTBED_NODE_NAME:-testbed-node}"
        wait_for "the local kubelet's Node to be Ready" kubelet 60 test -e "$DIR/kubelet/ready"
    fi
    if [[ "$kcm" != 0 ]]; then
        wait_for "kube-controller-manager to collect garbage" kube-controller-manager 60 \
            kc -n kube-system wait --for=delete configmap/testbed-gc-probe --timeout=5s
    fi
    cat > "$DIR/env" <<EOF
export KUBECONFIG=$DIR/kubeconfig
export PATH=$BIN:\$PATH
EOF
    trap - EXIT
    log "up: KUBECONFIG=$DIR/kubeconfig (apiserver https://127.0.0.1:$APISERVER_PORT, etcd :$ETCD_PORT)"
}

kc() { "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" "$@"; }

# Only the controllers the tests need: owner-reference garbage collection, namespace deletion, and
# Endpoints/EndpointSlices for Services with a selector (plus slices mirrored from hand-made Endpoints).
# Not the deployment/replicaset/statefulset/job controllers: the Deployments and Jobs tests create
# must stay inert (the operator creates Pods itself); not serviceaccount(-token): no default
# ServiceAccounts and no token Secrets, as before (`kubectl create token` needs no controller).
KCM_CONTROLLERS=garbage-collector-controller,namespace-controller
KCM_CONTROLLERS+=,endpoints-controller,endpointslice-controller,endpointslice-mirroring-controller

start_controller_manager() {
    write_kubeconfig "$DIR/kube-controller-manager.kubeconfig" kube-controller-manager system:kube-controller-manager
    # Up means collecting: this ConfigMap's owner does not exist, so the garbage collector deletes it
    # once its informers have synced; start waits for that (there is no healthz to poll with
    # --secure-port 0, and healthz would not say the caches are synced anyway).
    kc -n kube-system create -f - >/dev/null <<EOF
{"apiVersion": "v1", "kind": "ConfigMap",
 "metadata": {"name": "testbed-gc-probe", "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
   "name": "testbed-gc-probe-owner", "uid": "00000000-0000-0000-0000-000000000000"}]}}
EOF
    # One testbed per pytest-xdist worker on 2 cores: few workers per controller (the defaults are
    # 5-20), no HTTPS server (no port to pick, no serving certificate to generate), no profiling.
    # The default API rate limit (20/s) is kept: the namespace controller already gets 20 times it.
    spawn kube-controller-manager "$DIR/logs/kube-controller-manager.log" "$BIN/kube-controller-manager" \
        --kubeconfig "$DIR/kube-controller-manager.kubeconfig" \
        --controllers "$KCM_CONTROLLERS" \
        --use-service-account-credentials=false --leader-elect=false \
        --secure-port 0 --profiling=false \
        --concurrent-gc-syncs 2 --concurrent-namespace-syncs 2 \
        --concurrent-endpoint-syncs 2 --concurrent-service-endpoint-syncs 2 \
        --mirroring-concurrent-service-endpoint-syncs 1 \
        --v 1
}

wait_for_quiet() {  # like wait_for, but returns 1 instead of dying
    local proc="$1" timeout="$2"; shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        alive "$proc" || return 1
        (( SECONDS < deadline )) || return 1
        sleep 0.2
    done
}

signal_proc() {  # signal_proc NAME SIGNAL: signal its process group (it runs in its own session)
    local pid; pid="$(pid_of "$1")"
    [[ -n "$pid" ]] || return 0
    kill "-$2" -- "-$pid" 2>/dev/null || kill "-$2" "$pid" 2>/dev/null || true
}

wait_gone() {  # wait_gone SECONDS NAME...: wait for the processes to exit, SIGKILL the rest
    local deadline=$((SECONDS + $1)); shift
    local n pid
    for n in "$@"; do
        pid="$(pid_of "$n")"
        [[ -n "$pid" ]] || continue
        while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.1; done
        signal_proc "$n" KILL
    done
}

kill_proc() {  # kill_proc NAME: SIGTERM, SIGKILL after 10 s
    signal_proc "$1" TERM
    wait_gone 10 "$1"
}

stop() {
    DIR="$(state_dir "${1:-}")"
    [[ -f "$DIR/pids" ]] || return 0
    # the kubelet first (it stops its pods' processes), then the control plane together
    if [[ -n "$(pid_of kubelet)" ]]; then kill_proc kubelet; fi
    signal_proc kube-controller-manager TERM
    signal_proc kube-apiserver TERM
    signal_proc etcd TERM
    wait_gone 10 kube-controller-manager kube-apiserver etcd
    # pod processes the kubelet could not stop itself (it was SIGKILLed): their pids are on file
    if [[ -d "$DIR/kubelet/pods" ]]; then
        local f
        while IFS= read -r f; do
            local p; p="$(cat "$f" 2>/dev/null || true)"
            [[ -n "$p" ]] && { kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true; }
        done < <(find "$DIR/kubelet/pods" -name pid -type f)
    fi
    rm -f "$DIR/pids"
    log "stopped ($DIR)"
}

env_cmd() {
    DIR="$(state_dir "${1:-}")"
    [[ -f "$DIR/env" ]] || die "no testbed running in $DIR (run: $0 start $DIR)"
    cat "$DIR/env"
}

case "${1:-}" in
    build) build ;;
    start) start "${2:-}" ;;
    stop)  stop "${2:-}" ;;
    env)   env_cmd "${2:-}" ;;
    bin)   echo "$BIN" ;;
    *) sed -n '2,23p' "$0" >&2; exit 2 ;;
esac
