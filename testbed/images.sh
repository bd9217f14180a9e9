#!/usr/bin/env bash
# Build the project's container images without a Docker engine or a registry (the testbed's tool,
# not a test): base images made from Debian packages, then our Dockerfiles, unchanged, with buildah.
#
#   testbed/images.sh            install what is missing, build what changed, export the archives
#   testbed/images.sh --list     what would be built, and whether it is cached
#
# Cache (outside the clone): ${TXBROKER_CACHE:-~/.cache/txbroker}/images/
#   base-python-3.11.tar         the Debian bookworm base, tagged docker.io/library/python:3.11-slim
#   wheels/                      the pinned wheels our images install (a wheelhouse made on the host)
#   <image>-<inputs hash>.tar    an image as a docker archive, ready for `ctr -n k8s.io images import`
#
# Why a wheelhouse and not the host's CA bundle as a build secret: with the wheels built on the host
# from constraints.txt, a build needs no network at all (the same pinned files the tests run with,
# and a rebuild does not depend on the index being reachable), and the Dockerfiles stay as a user
# builds them with `docker build`: pip inside the build is pointed at the wheels by a pip.conf
# mounted for the build (PIP no-index + find-links), not by anything in the Dockerfile.
# An image is rebuilt only when its inputs change: a hash of its Dockerfile, the files it copies
# (git ls-files), constraints.txt and the base image's archive.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${TXBROKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/txbroker}/images"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")"
log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }

need_packages() {
    local missing=()
    for cmd in buildah runc mmdebstrap; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
    [[ ${#missing[@]} -eq 0 ]] && return
    [[ $(id -u) -eq 0 ]] || die "missing ${missing[*]}: install buildah runc mmdebstrap (as root)"
    log "installing buildah, runc, mmdebstrap from Debian's packages"
    apt-get update -qq && apt-get install -y -qq --no-install-recommends buildah runc mmdebstrap >/dev/null
}

# The base the Dockerfiles name, made from Debian packages: bookworm's Python 3.11, as pip expects
# it in the official image (no PEP 668 marker, `python` on PATH).
base_image() {
    local tar="$CACHE/base-python-3.11.tar"
    if [[ ! -f "$tar" ]]; then
        log "making the Python 3.11 base from Debian bookworm packages (mmdebstrap)"
        local dir; dir="$(mktemp -d)"
        mmdebstrap --quiet --variant=minbase --include=python3.11,python3-venv,python3-pip,ca-certificates,passwd \
            bookworm "$dir/rootfs" >/dev/null
        rm -f "$dir"/rootfs/usr/lib/python3.11/EXTERNALLY-MANAGED
        ln -sf /usr/bin/python3 "$dir/rootfs/usr/local/bin/python"
        tar -C "$dir/rootfs" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
        rm -rf "$dir"
    fi
    if ! buildah inspect --type image docker.io/library/python:3.11-slim >/dev/null 2>&1; then
        local ctr; ctr="$(buildah from scratch)"
        buildah add --quiet "$ctr" "$tar" / >/dev/null
        buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd python3 "$ctr"
        buildah commit --quiet "$ctr" docker.io/library/python:3.11-slim >/dev/null
        buildah rm "$ctr" >/dev/null
    fi
}

wheelhouse() {
    local stamp="$CACHE/wheels/.constraints"
    if ! cmp -s "$ROOT/constraints.txt" "$stamp" 2>/dev/null; then
        log "building the wheelhouse from constraints.txt"
        mkdir -p "$CACHE/wheels"
        "$PY" -m pip wheel --quiet -c "$ROOT/constraints.txt" -w "$CACHE/wheels" "$ROOT[operator]" "setuptools>=77"  # setuptools: the build backend
        cp "$ROOT/constraints.txt" "$stamp"
    fi
    printf '[global]\nno-index = true\nfind-links = /wheels\n' > "$CACHE/pip.conf"
}

inputs_hash() {  # Dockerfile, then every tracked file under the folders it copies
    local dockerfile=$1; shift
    (cd "$ROOT" && { cat "$dockerfile" constraints.txt; git ls-files -s -- pyproject.toml README.md "$@"; \
        sha256sum "$CACHE/base-python-3.11.tar"; } | sha256sum | cut -c1-16)
}

build() {  # name dockerfile copied-folders...
    local name=$1 dockerfile=$2; shift 2
    local hash; hash="$(inputs_hash "$dockerfile" "$@")"
    local tar="$CACHE/$name-$hash.tar" tag="docker.io/txbroker/$name:$VERSION"
    if [[ -f "$tar" ]]; then log "$tag: cached ($tar)"; echo "$tar"; return; fi
    log "$tag: building from $dockerfile"
    local t0=$SECONDS
    buildah bud --quiet --runtime /usr/sbin/runc --pull=never --network host --layers=false \
        -v "$CACHE/wheels:/wheels:ro" -v "$CACHE/pip.conf:/etc/pip.conf:ro" \
        -f "$ROOT/$dockerfile" -t "$tag" "$ROOT" >/dev/null
    rm -f "$CACHE/$name"-*.tar
    buildah push --quiet "$tag" "docker-archive:$tar.tmp:$tag" && mv "$tar.tmp" "$tar"
    log "$tag: built in $((SECONDS - t0)) s, $(du -h "$tar" | cut -f1)"
    echo "$tar"
}

mkdir -p "$CACHE"
need_packages
base_image
wheelhouse
build broker broker_image/Dockerfile broker_image
build operator operator/Dockerfile broker_image operator spark
