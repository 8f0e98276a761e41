#!/usr/bin/env bash
# Compactor measurements (docs/perf.md): query.sh's corpus in one past hour,
# the query battery before compaction, after the hot merge and after the
# cold rewrite (`mira compactor --once`), each against ClickHouse (chdb) over
# the same records; objects, bytes per OTLP wire byte, and the compactor's
# CPU cost. Needs .venv (scripts/python-env.sh) and installs chdb into it.
# Usage: scripts/measure/compactor.sh [log-blocks] [records-per-block]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p mira
scripts/python-env.sh >/dev/null
.venv/bin/pip install -q chdb
MIRA_BIN="$PWD/target/release/mira" .venv/bin/python scripts/measure/compactor.py "$@"
