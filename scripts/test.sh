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
cargo test --workspace --locked
