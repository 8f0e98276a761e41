#!/usr/bin/env bash
# The test command: format check, clippy with warnings as errors, then the
# whole workspace test suite. Run from anywhere inside the repository.
set -euo pipefail
export CARGO_TERM_COLOR=never
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
# Benches are compiled by clippy above; tests run in the same debug profile
# so nothing is built twice.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
# One closing line for the whole suite (cargo prints one per test binary,
# and the last of those is a doc-test run that may hold no tests).
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
