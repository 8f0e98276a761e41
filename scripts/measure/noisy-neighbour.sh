#!/usr/bin/env bash
# Noisy neighbour (issue 29 item 10, docs/perf.md "Noisy neighbour"): two
# well-behaved tenants ingesting and querying beside a hostile one sending
# the worst requests known; prints the calm tenants' ingest rate and query
# p50/p99 as ratios against windows without the hostile tenant in the same
# run (target: rate >= 0.8, p99 <= 2x, no restart). See the header of
# noisy_neighbour.py.
# Usage: scripts/measure/noisy-neighbour.sh [seconds-per-window] [rounds]
# Environment: MIRA_BIN (the `mira` measured; default: build --release).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${MIRA_BIN:-}" ]; then
  cargo build --release -p mira
  MIRA_BIN="$PWD/target/release/mira"
fi
exec python3 scripts/measure/noisy_neighbour.py "$MIRA_BIN" "${1:-10}" "${2:-3}"
