#!/usr/bin/env bash
# The whole test suite: installs what it needs, then formatting, lints, and
# every test (unit, simulation, real processes, real S3 servers, real
# clients). This is the command CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-tools.sh
export FENCEGATE_MOTO_SERVER="$PWD/.venv/bin/moto_server"

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> cargo test"
# Includes tests/nemesis.rs: a 3-minute nemesis pass over the whole system
# in network namespaces, a new seed each run (printed; replay it with
# scripts/nemesis.sh --seed S --minutes 3).
cargo test --workspace --locked
# The lease-service tests again, every lease service on a 3-member etcd
# cluster instead of SQLite (tests/support/etcd.rs): the same tests, not a
# copy. The history checker of tests/faults.rs then spreads its clients
# over two replicas; the status page lists locks from etcd.
echo "==> cargo test, lease services on etcd"
FENCEGATE_TEST_LEASE_BACKEND=etcd cargo test --workspace --locked \
  --test locksvc --test adversarial_locksvc --test run_cmd --test rotation --test tls --test faults \
  --test status_page --test locksvc_browser
