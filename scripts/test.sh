#!/usr/bin/env bash
# The test command: format check, clippy with warnings as errors, then the
# whole workspace test suite. Run from anywhere inside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
# Benches are compiled by clippy above; tests run in the same debug profile
# so nothing is built twice.
cargo test --workspace --locked
