#!/usr/bin/env bash
# Runs the benchmark suite (see BENCHMARKS.md).
#
#   scripts/bench.sh                 # everything, full sizes (~10 min on 2 cores)
#   scripts/bench.sh --quick         # smoke test: small counts, no 1 GiB object
#   scripts/bench.sh --out my.json   # any fencegate-bench option is passed on
#
# Installs etcd-server (Debian) if it is missing, builds the release
# `fencegate` binary under test and the release bench, then runs
# `fencegate-bench all "$@"`, which prints tables and writes the JSON
# results (bench-results.json unless --out says otherwise).
set -euo pipefail

cd "$(dirname "$0")/.."

if ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bench.sh: installing etcd-server (Debian) for the lease service comparison" >&2
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server
    else
        echo "bench.sh: etcd is missing and cannot be installed here (needs root and apt-get);" \
             "the etcd comparison will be reported as not measured" >&2
    fi
fi
# The Debian package may start a system etcd on the default ports; the bench
# starts its own on ephemeral ports and does not use it.

cargo build --release -p fencegate --bin fencegate
cargo build --release -p fencegate-bench

bin="${CARGO_TARGET_DIR:-target}/release"
exec "$bin/fencegate-bench" all --fencegate "$bin/fencegate" "$@"
