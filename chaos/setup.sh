#!/usr/bin/env bash
# What the fault harness needs beyond the virtualenv, from Debian's packages: iptables (partitions,
# packet filters inside each broker's network namespace), libfaketime (a broker's skewed wall
# clock) and fuse3 (libfuse3 and fusermount3 for chaos/lazyfs.py, the power-loss filesystem; mfusepy
# in the venv binds to it). ip, nsenter and mount come with the base system. Root, as the harness itself.
set -euo pipefail
missing=()
command -v iptables >/dev/null || missing+=(iptables)
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || missing+=(libfaketime)
{ command -v fusermount3 >/dev/null && [ -e /usr/lib/x86_64-linux-gnu/libfuse3.so.3 ]; } || missing+=(fuse3)
for cmd in ip nsenter mount; do
    command -v "$cmd" >/dev/null || { echo "chaos: $cmd is missing (iproute2, util-linux)" >&2; exit 1; }
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "chaos: installing ${missing[*]}" >&2
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
