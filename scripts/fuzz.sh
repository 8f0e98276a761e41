#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (default 60 s each). Not part
# of CI: needs a nightly-capable cargo-fuzz setup (`cargo install cargo-fuzz`).
# Usage: scripts/fuzz.sh [seconds-per-target]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
for target in $(cargo fuzz list); do
  echo "== $target ($secs s)"
  cargo fuzz run "$target" -- -max_total_time="$secs" -malloc_limit_mb=512
done
