#!/usr/bin/env bash
# Scan layouts against ClickHouse (docs/perf.md): 10 sealed blocks vs one
# merged hot block (arrival order, clustered by resource) vs one cold block,
# and 1,000 x 1,000-record blocks vs merged, scanned as the querier does,
# with ClickHouse (chdb) on the same records. Needs .venv
# (scripts/python-env.sh) with chdb.
# Usage: scripts/measure/layouts.sh [records] [threads]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p mira-core --example layouts
scripts/python-env.sh >/dev/null
.venv/bin/pip install -q chdb
LAYOUTS_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/examples/layouts" .venv/bin/python scripts/measure/layouts.py "$@"
