#!/usr/bin/env bash
# A long nemesis run (issue 37): the whole system, every process in a
# network namespace of its own, under faults drawn from a seed; the whole
# history checked, the availability figures written to a report.
#   scripts/nemesis.sh [--minutes N] [--seed S] [--report FILE]
# Needs root (network namespaces, nftables). The suite runs a 3-minute
# pass of the same test (tests/nemesis.rs, a_seeded_nemesis_run_checks_out).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=60
seed=$(( $(od -An -N4 -tu4 /dev/urandom) % 1000000 ))
report="target/nemesis-report.md"
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --report) report="$2"; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "nemesis.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done
scripts/install-test-tools.sh
export FENCEGATE_MOTO_SERVER="$PWD/.venv/bin/moto_server"
mkdir -p "$(dirname "$report")"
# The run's own copy of the binary: a rebuild meanwhile does not change
# what a restarted process runs.
cargo build --bin fencegate
cargo test --no-run --test nemesis
binary="$(dirname "$(realpath -m "$report")")/fencegate-$(git rev-parse --short HEAD)"
cp target/debug/fencegate "$binary"
echo "==> nemesis: $minutes minutes, seed $seed, commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with local changes)')"
echo "    report $report (history: $report.history), binary $binary"
FENCEGATE_NEMESIS_MINUTES="$minutes" FENCEGATE_NEMESIS_SEED="$seed" \
  FENCEGATE_NEMESIS_REPORT="$(realpath -m "$report")" FENCEGATE_NEMESIS_BINARY="$binary" \
  cargo test --test nemesis a_seeded_nemesis_run_checks_out -- --nocapture
echo "==> report: $report"
cat "$report"
