#!/usr/bin/env bash
# Query measurements (docs/perf.md): `mira serve` over >= 1,000 small blocks
# (trace by id, newest 100 log lines, a body filter matching nothing, an
# attribute filter, a `sum by (rate[5m])` over an hour; warm and cold) and
# the same logical queries on ClickHouse (chdb, in process) over the same
# records, with the ratio Mira / ClickHouse. Needs .venv (scripts/python-env.sh)
# and installs chdb into it.
# Usage: scripts/measure/query.sh [log-blocks] [records-per-block]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p mira
scripts/python-env.sh >/dev/null
.venv/bin/pip install -q chdb
MIRA_BIN="$PWD/target/release/mira" .venv/bin/python scripts/measure/query.py "$@"
