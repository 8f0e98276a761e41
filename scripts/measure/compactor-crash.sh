#!/usr/bin/env bash
# Compactor crash trials (docs/perf.md): `mira compactor` among a real
# `mira catalog` and `mira ingester`, killed -9 at random points while it
# merges under load, TRIALS times (the suite runs 2), then one final
# `mira compactor --once`. After every trial the live blocks hold exactly
# the acknowledged records, once each; at the end the store holds only
# objects the catalog names (no orphan survives the sweep). Also runs the
# deterministic abort at every step of a job.
# Usage: scripts/measure/compactor-crash.sh [TRIALS]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/../.."
export MIRA_CRASH_TRIALS="${1:-10}"
cargo test -p mira --features mira/fault-hooks --test compaction -- --nocapture killed
