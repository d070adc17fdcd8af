#!/usr/bin/env bash
# Instructions the proxy executes per small PUT, counted by callgrind: the
# measure of the proxy's own work that the host's noise does not move
# (BENCHMARKS.md, "Instructions per PUT").
#
#   scripts/bench-instructions.sh [FENCEGATE ...]
#
# Each binary (default: target/release/fencegate) runs as the proxy of
# `fencegate-bench small --no-nginx --concurrency 8` under
# `valgrind --tool=callgrind`. After the load has started, the counts are
# zeroed, 20 s of PUTs are counted, and the counts dumped; the PUTs are
# read from the proxy's own `fencegate_proxy_edge_puts_total`. Printed per
# PUT: all instructions, SHA-256's (`compress256`), and the rest.
#
# SHA-256 is shown apart because valgrind's CPU has no SHA extensions:
# under it sha2 runs its portable code (~340k instructions per 4 KiB PUT),
# where on the host it runs the SHA-NI code, a few microseconds. "Without
# SHA-256" is the comparable number.
#
# KEEP=DIR keeps each binary's callgrind profile in DIR.
#
# Installs valgrind (Debian) if it is missing; builds the release bench.
set -euo pipefail
[ -n "${TRACE:-}" ] && set -x
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null 2>&1; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends valgrind
fi
# As scripts/bench.sh builds them (one package at a time: built together,
# their features unify differently and each build undoes the other's).
cargo build --release -p fencegate --bin fencegate >&2
cargo build --release -p fencegate-bench >&2

bins=("$@")
[ "${#bins[@]}" -gt 0 ] || bins=(target/release/fencegate)

work=$(mktemp -d)
trap 'pkill -f "callgrind.*$work" 2>/dev/null || true; rm -rf "$work"' EXIT

printf '%-50s %10s %12s %14s %12s\n' binary puts "instr/PUT" "SHA-256/PUT" "rest/PUT"
for bin in "${bins[@]}"; do
    bin=$(realpath "$bin")
    cat >"$work/proxy.sh" <<EOF
#!/bin/sh
if [ "\$1" = proxy ]; then
  exec valgrind --tool=callgrind --callgrind-out-file=$work/out.%p "$bin" "\$@" 2>>$work/valgrind.log
fi
exec "$bin" "\$@"
EOF
    chmod +x "$work/proxy.sh"
    rm -f "$work"/out.*
    target/release/fencegate-bench small --fencegate "$work/proxy.sh" --no-nginx \
        --concurrency 8 --rounds 1 --round-secs 60 --tmp-dir "$work" \
        --out "$work/bench.json" >"$work/bench.log" 2>&1 &
    bench=$!
    pid= port=
    for _ in $(seq 120); do
        pid=$(pgrep -f "callgrind.*$work.*proxy" | head -1 || true)
        if [ -n "$pid" ]; then
            port=$(ss -ltnp | awk -v p="pid=$pid," 'index($0, p) && !n++ {sub(/.*:/, "", $4); print $4}')
            [ -n "$port" ] && break
        fi
        sleep 1
    done
    [ -n "$port" ] || { echo "the proxy under callgrind did not start" >&2; cat "$work/bench.log" >&2; exit 1; }
    puts() {
        curl -s "http://127.0.0.1:$port/_fencegate/metrics" |
            awk '/^fencegate_proxy_edge_puts_total/ {s += $2} END {print s + 0}'
    }
    # Until the load runs.
    for _ in $(seq 120); do
        a=$(puts); sleep 1; b=$(puts)
        [ "$b" -gt "$a" ] && break
    done
    sleep 3
    callgrind_control -z "$pid" >/dev/null 2>&1
    a=$(puts)
    sleep 20
    b=$(puts)
    callgrind_control -d "$pid" >/dev/null 2>&1
    kill "$bench" 2>/dev/null || true
    wait "$bench" 2>/dev/null || true
    pkill -f "callgrind.*$work.*proxy" 2>/dev/null || true
    out=$(ls -t "$work"/out.* | head -1)
    # KEEP=DIR keeps each binary's profile there, for callgrind_annotate.
    [ -z "${KEEP:-}" ] || { mkdir -p "$KEEP" && cp "$out" "$KEEP/$(basename "$bin").callgrind"; }
    total=$(callgrind_annotate --auto=no "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !n++ {gsub(",", "", $1); print $1}')
    sha=$(callgrind_annotate --inclusive=yes --auto=no "$out" 2>/dev/null |
        awk '/sha2::sha256::compress256 \[/ && !n++ {gsub(",", "", $1); print $1}')
    n=$((b - a))
    printf '%-50s %10d %12d %14d %12d\n' "$bin" "$n" $((total / n)) $((${sha:-0} / n)) $(((total - ${sha:-0}) / n))
done
