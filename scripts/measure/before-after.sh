#!/usr/bin/env bash
# Before and after: the same ingest and query load on two mira binaries,
# alternating, in one run; prints after/before ratios (see the header of
# before_after.py; docs/perf.md "Noisy neighbour").
# Usage: scripts/measure/before-after.sh BEFORE_BIN AFTER_BIN [seconds] [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 scripts/measure/before_after.py "$@"
