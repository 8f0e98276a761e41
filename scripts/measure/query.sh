#!/usr/bin/env bash
# Query measurements (docs/perf.md): `mira serve` over >= 1,000 small blocks
# (trace by id, newest 100 log lines, a body filter matching nothing, an
# attribute filter, a `sum by (rate[5m])` over an hour; warm and cold) and
# the same logical queries on ClickHouse (chdb, in process) over the same
# records, with the ratio Mira / ClickHouse; then the repeated-query case
# (first run, identical repeat, sliding range; logs and metrics) of the
# result cache. MIRA_MEASURE_REPEATED_ONLY=1 runs only that case. Needs .venv
# (scripts/python-env.sh) and installs chdb into it. Builds into
# $CARGO_TARGET_DIR when set.
# Usage: scripts/measure/query.sh [log-blocks] [records-per-block]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p mira
scripts/python-env.sh >/dev/null
.venv/bin/pip install -q chdb
MIRA_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/mira" .venv/bin/python scripts/measure/query.py "$@"
