#!/usr/bin/env bash
# The long fault runs (not part of CI): 20 kill -9 cycles of the lease
# service and the proxy under load, and the history checker over many seeds.
#   scripts/soak.sh [cycles] [seeds]
set -euo pipefail
cd "$(dirname "$0")/.."
cycles="${1:-20}"
seeds="${2:-10}"
scripts/install-test-tools.sh
export FENCEGATE_MOTO_SERVER="$PWD/.venv/bin/moto_server"
echo "==> $cycles kill -9 cycles under load"
FENCEGATE_CRASH_CYCLES="$cycles" cargo test --release --test faults kill_9 -- --nocapture
for seed in $(seq 1 "$seeds"); do
  echo "==> history seed $seed"
  FENCEGATE_HISTORY_SEED="$seed" cargo test --release --test faults a_random_multi_client_history -- --nocapture
done
echo "==> 1,000,000 schedules of the replica protocol (core/tests/replica_simulation.rs)"
FENCEGATE_SIM_SEEDS=1000000 cargo test --release -p fencegate-core --test replica_simulation the_protocol_holds -- --nocapture
