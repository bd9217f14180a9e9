#!/usr/bin/env bash
# The cluster's binaries, built from pinned sources with Go and cached outside the clone (the
# testbed's tool, not a test; testbed/cluster.sh calls it):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet, kubectl (one
#   pinned k8s.io/kubernetes module, go/kube), etcd (go/etcd) and helm; versions in versions.env.
#
#   testbed/build.sh build    build whatever binary is missing into $TXBROKER_K8S_BIN or
#                             ~/.cache/txbroker/k8s-bin/<k8s-version>/
#   testbed/build.sh bin      print that directory
#
# Environment:
#   TXBROKER_K8S_BIN   a directory holding the binaries prebuilt: used as it is, nothing is built
#   TXBROKER_CACHE     cache root (default ~/.cache/txbroker)
#   GO                 go command (default: `go` on PATH, else /usr/local/go/bin/go)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${TXBROKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/txbroker}"
BIN="${TXBROKER_K8S_BIN:-$CACHE/k8s-bin/$K8S_VERSION}"
K8S_MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"

log() { printf '[build] %s\n' "$*" >&2; }
die() { printf '[build] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------

find_go() {
    if [[ -n "${GO:-}" ]]; then echo "$GO"; return; fi
    if command -v go >/dev/null 2>&1; then command -v go; return; fi
    if [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go; return; fi
    die "Go is needed to build the cluster ($K8S_VERSION kube-apiserver and kube-controller-manager, etcd $ETCD_VERSION, \
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

case "${1:-}" in
    build) build ;;
    bin)   echo "$BIN" ;;
    *) sed -n '2,15p' "$0" >&2; exit 2 ;;
esac
