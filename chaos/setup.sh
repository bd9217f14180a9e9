#!/usr/bin/env bash
# What the fault harness needs beyond the virtualenv: libfaketime (a broker's skewed wall clock).
# Root, as the harness itself (network namespaces, packet filters, tmpfs mounts).
set -euo pipefail
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then
    echo "chaos: installing libfaketime" >&2
    apt-get update -qq && apt-get install -y -qq --no-install-recommends libfaketime >/dev/null
fi
