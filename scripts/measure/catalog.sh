#!/usr/bin/env bash
# Catalog measurements (docs/perf.md): publish commands/s on a local
# 3-member cluster (unbatched and batched), list latency at 100k blocks,
# snapshot size and build time at 100k and 1M blocks.
# Usage: scripts/measure/catalog.sh   (MIRA_BENCH_QUICK=1 for a short run)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo bench -p mira-catalog --bench catalog
