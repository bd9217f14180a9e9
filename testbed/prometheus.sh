#!/usr/bin/env bash
# Prometheus and promtool, built from the pinned Go module (testbed/go/prometheus, version in
# versions.env) and cached outside the clone, as build.sh does for the cluster. The monitoring
# tests use them: promtool for `promtool test rules` / `check rules` (tests/unit, so `make test`
# builds it when missing), prometheus for the local scrape test and the e2e alert run.
#
#   testbed/prometheus.sh build   build whatever is missing into $TXBROKER_PROMETHEUS_BIN or
#                                 ~/.cache/txbroker/prometheus/<version>/
#   testbed/prometheus.sh bin     print that directory
#
# Environment:
#   TXBROKER_PROMETHEUS_BIN  a directory holding prometheus and promtool prebuilt: used as it is
#   TXBROKER_CACHE           cache root (default ~/.cache/txbroker)
#   GO                       go command (default: `go` on PATH, else /usr/local/go/bin/go)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${TXBROKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/txbroker}"
BIN="${TXBROKER_PROMETHEUS_BIN:-$CACHE/prometheus/$PROMETHEUS_VERSION}"
RECIPE="prometheus $PROMETHEUS_VERSION trimpath-v1"

log() { printf '[prometheus] %s\n' "$*" >&2; }
die() { printf '[prometheus] ERROR: %s\n' "$*" >&2; exit 1; }

find_go() {
    if [[ -n "${GO:-}" ]]; then echo "$GO"; return; fi
    if command -v go >/dev/null 2>&1; then command -v go; return; fi
    if [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go; return; fi
    die "Go is needed to build prometheus and promtool ($PROMETHEUS_VERSION); install it or set \
TXBROKER_PROMETHEUS_BIN to a directory holding them prebuilt."
}

have() {
    [[ -n "${TXBROKER_PROMETHEUS_BIN:-}" ]] && { [[ -x "$BIN/prometheus" && -x "$BIN/promtool" ]]; return; }
    [[ -x "$BIN/prometheus" && -x "$BIN/promtool" && "$(cat "$BIN/.stamp" 2>/dev/null)" == "$RECIPE" ]]
}

build() {
    if have; then return 0; fi
    [[ -z "${TXBROKER_PROMETHEUS_BIN:-}" ]] || die "TXBROKER_PROMETHEUS_BIN=$BIN lacks prometheus or promtool"
    mkdir -p "$BIN"
    exec 9>"$BIN/.build.lock"   # one build at a time; the others wait, then find it built
    flock 9
    if have; then return 0; fi
    local go; go="$(find_go)"
    local t0=$SECONDS
    local tmp; tmp="$(mktemp -d "$BIN/.build.XXXXXX")"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    export GOFLAGS=-mod=mod
    # v0.MNN.P of the Go module is Prometheus M.NN.P (v0.316.0: 3.16.0)
    local m="${PROMETHEUS_VERSION#v0.}"; local v="${m:0:1}.${m:1:2}.${m#*.}"
    local vp=github.com/prometheus/common/version
    log "building prometheus and promtool $PROMETHEUS_VERSION (first time: about 10-20 min on 2 cores) ..."
    (cd "$HERE/go/prometheus" && nice -n 15 "$go" build -trimpath -tags netgo \
        -ldflags "-s -w -X $vp.Version=$v -X $vp.Revision=$PROMETHEUS_VERSION -X $vp.Branch=module" \
        -o "$tmp/" github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool)
    mv -f "$tmp/prometheus" "$tmp/promtool" "$BIN/"
    echo "$RECIPE" > "$BIN/.stamp"
    log "built into $BIN in $((SECONDS - t0)) s"
}

case "${1:-}" in
    build) build ;;
    bin)   echo "$BIN" ;;
    *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
