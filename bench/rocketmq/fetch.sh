#!/usr/bin/env bash
# Fetch Apache RocketMQ (namesrv, broker, proxy, client) with every dependency from Maven Central
# into a cache OUTSIDE the clone, once:   ~/.cache/txbroker/rocketmq-<version>/lib/
# Then compile txbroker's own Java benchmark driver (bench/rocketmq/java/) against it into
#                                         ~/.cache/txbroker/rocketmq-<version>/bench-classes/
# A second run reuses both (the driver is recompiled only when its sources changed).
#
# Why no rocketmq-example: org.apache.rocketmq:rocketmq-example (home of RocketMQ's own
# benchmark.TransactionProducer / Producer / Consumer) is NOT published on Maven Central for any
# 4.3+ or 5.x release (last published: 4.2.0), and this machine reaches no other source. So
# bench/rocketmq/java/TxBench.java is our own driver that re-implements the same workload and
# the same figures (see bench/README.md, "Apache RocketMQ peer").
#
# Usage: bench/rocketmq/fetch.sh            prints the cache dir on its last line
# Env:   ROCKETMQ_VERSION (default pinned below), TXBROKER_CACHE (default ~/.cache/txbroker)
set -euo pipefail

VERSION="${ROCKETMQ_VERSION:-5.3.3}"   # pinned: newest 5.3.x whose namesrv, broker, proxy AND client are all on Central
CACHE_ROOT="${TXBROKER_CACHE:-$HOME/.cache/txbroker}"
DEST="$CACHE_ROOT/rocketmq-$VERSION"
LIB="$DEST/lib"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ -f "$LIB/.complete" ]]; then
    echo "rocketmq $VERSION: reusing $LIB ($(ls "$LIB" | wc -l) jars)" >&2
else
    command -v mvn >/dev/null || { echo "mvn not found (apt-get install maven)" >&2; exit 1; }
    TMP="$(mktemp -d)"
    trap 'rm -rf "$TMP"' EXIT
    cat > "$TMP/pom.xml" <<POM
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txbroker.bench</groupId>
  <artifactId>rocketmq-peer-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-namesrv</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-broker</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-proxy</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-client</artifactId><version>$VERSION</version></dependency>
  </dependencies>
</project>
POM
    rm -rf "$LIB.partial"
    mkdir -p "$DEST"
    echo "rocketmq $VERSION: resolving with maven into $LIB ..." >&2
    mvn -B -q -f "$TMP/pom.xml" dependency:copy-dependencies \
        -DoutputDirectory="$LIB.partial" -DincludeScope=runtime >&2
    touch "$LIB.partial/.complete"
    rm -rf "$LIB"
    mv "$LIB.partial" "$LIB"
    echo "rocketmq $VERSION: $(ls "$LIB" | wc -l) jars in $LIB" >&2
fi

# --- compile our driver (cheap; keyed on a hash of its sources) ---
CLASSES="$DEST/bench-classes"
SRC_HASH="$(cat "$HERE"/java/*.java | sha256sum | cut -c1-16)"
if [[ -f "$CLASSES/.hash" && "$(cat "$CLASSES/.hash")" == "$SRC_HASH" ]]; then
    echo "driver: reusing $CLASSES" >&2
else
    rm -rf "$CLASSES"; mkdir -p "$CLASSES"
    javac -nowarn -d "$CLASSES" -cp "$LIB/*" "$HERE"/java/*.java >&2
    echo "$SRC_HASH" > "$CLASSES/.hash"
    echo "driver: compiled into $CLASSES" >&2
fi
echo "$DEST"
