#!/usr/bin/env bash
# Core measurements (docs/perf.md): decode+append throughput, bytes on disk
# per wire byte and the layout/codec comparison, open+verify+scan.
# Usage: scripts/measure/core.sh [records-per-log-corpus]
set -euo pipefail
cd "$(dirname "$0")/../.."
export MIRA_BENCH_RECORDS="${1:-2000000}"
cargo bench -p mira-core --bench block
cargo bench -p mira-core --bench encode -- --noplot
cargo bench -p mira-core --bench open -- --noplot
