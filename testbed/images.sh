#!/usr/bin/env bash
# Build the project's container images without a Docker engine or a registry (the testbed's tool,
# not a test): base images made from Debian packages, then our Dockerfiles, unchanged, with buildah.
#
#   testbed/images.sh            install what is missing, build what changed, export the archives
#   testbed/images.sh --list     what would be built, and whether it is cached
#   testbed/images.sh --source DIR   the broker and operator images of another tree of this
#                                repository (a `git archive` of an older commit: the upgrade tests'
#                                previous release), tagged with that tree's version
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
SOURCE=""      # another tree to build from (--source), its archives named apart from ours
if [[ "${1:-}" == --source ]]; then
    [[ -f "${2:-}/pyproject.toml" ]] || { printf '[images] ERROR: --source needs a tree of this repository, got %s\n' "${2:-nothing}" >&2; exit 2; }
    SOURCE="$(cd "$2" && pwd)"
fi
CACHE="${TXBROKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/txbroker}/images"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "${SOURCE:-$ROOT}/pyproject.toml")"
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

# The base spark/Dockerfile names (Spark's official image), made from Debian's packages (Java 17,
# Python 3.11) and the pinned pyspark: its jars and scripts are Spark's binary distribution, laid out
# as the official image has it (/opt/spark/{bin,jars,python}), user 185, and an entrypoint of ours
# that keeps the official one's driver/executor contract (testbed/spark-base/entrypoint.sh).
SPARK_VERSION="$(sed -n 's/^pyspark==//p' "$ROOT/constraints.txt")"
SPARK_BASE="docker.io/apache/spark:$SPARK_VERSION-python3"
spark_base_image() {
    # the recipe: bump "recipe-1" when this function changes what goes in
    local key; key="$(cat "$HERE/spark-base/entrypoint.sh" <(echo "$SPARK_VERSION recipe-1") | sha256sum | cut -c1-16)"
    SPARK_BASE_KEY=$key
    local tar="$CACHE/base-spark-$key.tar"
    if [[ ! -f "$tar" ]]; then
        log "making $SPARK_BASE from Debian bookworm packages and pyspark $SPARK_VERSION"
        local site; site="$("$PY" -c 'import pyspark, os; print(os.path.dirname(os.path.dirname(pyspark.__file__)))')"
        [[ "$("$PY" -c 'import pyspark; print(pyspark.__version__)')" == "$SPARK_VERSION" ]] ||
            die "the virtualenv's pyspark is not $SPARK_VERSION (make venv)"
        local dir; dir="$(mktemp -d)"
        mmdebstrap --quiet --variant=minbase \
            --include=python3.11,python3-venv,python3-pip,ca-certificates,passwd,openjdk-17-jre-headless,procps \
            --customize-hook='chroot "$1" groupadd --system --gid 185 spark' \
            --customize-hook='chroot "$1" useradd --system --uid 185 --gid 185 --home-dir /opt/spark spark' \
            bookworm "$dir/rootfs" >/dev/null
        rm -f "$dir"/rootfs/usr/lib/python3.11/EXTERNALLY-MANAGED
        ln -sf /usr/bin/python3 "$dir/rootfs/usr/local/bin/python"
        local spark="$dir/rootfs/opt/spark"
        mkdir -p "$spark/python/lib" "$spark/work-dir"
        cp -r "$site/pyspark/jars" "$site/pyspark/bin" "$site/pyspark/sbin" "$spark/"
        cp -r "$site/pyspark" "$spark/python/pyspark"
        rm -rf "$spark/python/pyspark/jars" "$spark/python/pyspark/bin" "$spark/python/pyspark/sbin"
        local py4j; py4j="$("$PY" -c 'import py4j.version; print(py4j.version.__version__)')"
        (cd "$site" && "$PY" -m zipfile -c "$spark/python/lib/py4j-$py4j-src.zip" py4j)
        install -m 0755 "$HERE/spark-base/entrypoint.sh" "$dir/rootfs/opt/entrypoint.sh"
        chown -R 185:185 "$spark/work-dir"
        tar -C "$dir/rootfs" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
        rm -rf "$dir"
    fi
    if [[ "$(buildah inspect --type image --format '{{.FromImageID}}' "$SPARK_BASE" 2>/dev/null)" == "" ]] ||
            [[ ! -f "$CACHE/.spark-base-$key" ]]; then
        local ctr; ctr="$(buildah from scratch)"
        buildah add --quiet "$ctr" "$tar" / >/dev/null
        buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            --env SPARK_HOME=/opt/spark --env JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
            --workingdir /opt/spark/work-dir --entrypoint '["/opt/entrypoint.sh"]' --user 185 "$ctr"
        buildah commit --quiet "$ctr" "$SPARK_BASE" >/dev/null
        buildah rm "$ctr" >/dev/null
        touch "$CACHE/.spark-base-$key"
    fi
}

wheelhouse() {  # rebuilt when constraints.txt or the extras change
    local stamp="$CACHE/wheels/.constraints" want; want="$(cat "$ROOT/constraints.txt"; echo "extras: operator,spark")"
    if [[ "$want" != "$(cat "$stamp" 2>/dev/null)" ]]; then
        log "building the wheelhouse from constraints.txt"
        mkdir -p "$CACHE/wheels"
        "$PY" -m pip wheel --quiet -c "$ROOT/constraints.txt" -w "$CACHE/wheels" "$ROOT[operator,spark]" "setuptools>=77"  # setuptools: the build backend
        echo "$want" > "$stamp"
    fi
    printf '[global]\nno-index = true\nfind-links = /wheels\n' > "$CACHE/pip.conf"
}

files_of() {  # the files a build copies: tracked ones here, every file of a --source tree (no .git)
    if [[ -n "$SOURCE" ]]; then find "$@" pyproject.toml README.md -type f -not -path '*/__pycache__/*' -print0 | sort -z
    else git ls-files -z -- pyproject.toml README.md "$@"; fi
}

inputs_hash() {  # Dockerfile, then every tracked file under the folders it copies, then its base
    local dockerfile=$1; shift
    # the working tree's content of the tracked files (what the build copies), not the index's
    (cd "${SOURCE:-$ROOT}" && { cat "$dockerfile" constraints.txt; files_of "$@" | xargs -0 sha256sum; \
        if [[ "$dockerfile" == spark/* ]]; then echo "$SPARK_BASE_KEY"; else sha256sum "$CACHE/base-python-3.11.tar"; fi; } \
        | sha256sum | cut -c1-16)
}

build() {  # name dockerfile [--build-arg A=B] copied-folders...
    local name=$1 dockerfile=$2 args=(); shift 2
    [[ "${1:-}" == --build-arg ]] && { args=(--build-arg "$2"); shift 2; }
    local hash; hash="$(inputs_hash "$dockerfile" "$@")"
    local file=$name; [[ -n "$SOURCE" ]] && file="source-$VERSION-$name"   # never our own cache's name
    local tar="$CACHE/$file-$hash.tar" tag="docker.io/txbroker/$name:$VERSION"
    if [[ -f "$tar" ]]; then log "$tag: cached ($tar)"; echo "$tar"; return; fi
    log "$tag: building from $dockerfile"
    local t0=$SECONDS
    buildah bud --quiet --runtime /usr/sbin/runc --pull=never --network host --layers=false \
        -v "$CACHE/wheels:/wheels:ro" -v "$CACHE/pip.conf:/etc/pip.conf:ro" \
        "${args[@]}" -f "${SOURCE:-$ROOT}/$dockerfile" -t "$tag" "${SOURCE:-$ROOT}" >/dev/null
    rm -f "$CACHE/$file"-*.tar
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
[[ -n "$SOURCE" ]] && exit 0    # an older tree: its broker and operator are what an upgrade needs
spark_base_image
build spark spark/Dockerfile --build-arg "SPARK_IMAGE=$SPARK_BASE" broker_image spark
