#!/usr/bin/env bash
# What the fault harness needs beyond the virtualenv, from Debian's packages: iptables (partitions,
# packet filters inside each broker's network namespace) and libfaketime (a broker's skewed wall
# clock). ip, nsenter and mount come with the base system. Root, as the harness itself.
set -euo pipefail
missing=()
command -v iptables >/dev/null || missing+=(iptables)
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || missing+=(libfaketime)
for cmd in ip nsenter mount; do
    command -v "$cmd" >/dev/null || { echo "chaos: $cmd is missing (iproute2, util-linux)" >&2; exit 1; }
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "chaos: installing ${missing[*]}" >&2
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
