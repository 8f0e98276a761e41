#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (default 60 s each). Not part
# of CI. Needs `cargo install cargo-fuzz`. cargo-fuzz wants a nightly
# compiler; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept its flags.
# The sanitizer defaults to none (stable ships no ASan runtime); pass
# SANITIZER=address on a nightly toolchain.
# Usage: scripts/fuzz.sh [seconds-per-target]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
export RUSTC_BOOTSTRAP=1
for target in $(cargo fuzz list); do
  echo "== $target ($secs s)"
  cargo fuzz run -s "${SANITIZER:-none}" "$target" -- -max_total_time="$secs" -malloc_limit_mb=1024
done
