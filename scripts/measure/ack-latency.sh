#!/usr/bin/env bash
# Ack latency below saturation (docs/perf.md "Ack latency below saturation",
# issue 18 item 4): for each WAL mode, the capacity at 4 unpaced
# connections, then 4 connections paced at fractions of it, each against a
# fresh `mira ingester` (OTLP/gRPC, batch 8192 low-cardinality log records,
# `mira loadgen`). Prints records/s, ack p50/p99 and the mean / p50 of each
# phase of mira_ingester_phase_seconds, diffed before and after each point
# (scripts/measure/ack_latency.py).
# Usage: scripts/measure/ack-latency.sh [seconds-per-point]
# Environment: WALS (default "page-cache fsync"), FRACTIONS (default
# "0.25 0.5 0.75"), CONNS (4), BATCH (8192), INGESTER_FLAGS, MIRA_BIN (the
# `mira` whose ingester is measured; default: build --release) and
# LOADGEN_BIN (the `mira` whose loadgen drives it; default MIRA_BIN).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${MIRA_BIN:-}" ]; then
  cargo build --release -p mira
  MIRA_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/mira"
fi
export MIRA_BIN
exec python3 scripts/measure/ack_latency.py "${1:-10}"
