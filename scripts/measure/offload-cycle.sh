#!/usr/bin/env bash
# Retention and offload (docs/perf.md, issue 14): offload and restore
# MiB/s over >= 3 GiB of real cold blocks against `cp -r` of the same files
# in the same run, byte-identical restore (diff -r) and query answers, a
# second restore copying nothing; `mira offload list` over 10,000
# offloaded blocks; retention over 100,000 blocks (time, catalog commands
# per dropped block); ingest at 4 connections alone and during a
# retention sweep plus an offload at --offload-rate 50MiB.
# The blocks are made by the `offload_cycle` example of mira-compactor
# (no OTLP ingest). Not part of CI.
# Usage: scripts/measure/offload-cycle.sh
# Environment: MIRA_PHASES (cycle,list,retention,ingest), CYCLE_BYTES
# (3300MiB), INGEST_S (10), INGEST_MAX_B (20), INGEST_OFFLOAD_BYTES
# (3.5 x INGEST_S x 50MiB), INGEST_RETENTION_BLOCKS (30000), INGEST_STAGES
# (sweep,offload), COMPACTOR_FLAGS,
# COMP_PREFIX,
# LIST_BLOCKS (10000),
# RETENTION_BLOCKS (100000), RESTORE_RATE (0: no limit),
# MIRA_SCRATCH (a directory on the volume to measure; default $TMPDIR),
# MIRA_REF_DIR (where the reference copy goes; default /dev/shm), and
# MIRA_BIN / GEN_BIN to skip the release builds. Needs ~2x CYCLE_BYTES
# free on the scratch volume and CYCLE_BYTES in MIRA_REF_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${MIRA_BIN:-}" ] || [ -z "${GEN_BIN:-}" ]; then
  cargo build --release -p mira --bin mira
  cargo build --release -p mira-compactor --example offload_cycle
  target="${CARGO_TARGET_DIR:-$PWD/target}"
  MIRA_BIN="${MIRA_BIN:-$target/release/mira}"
  GEN_BIN="${GEN_BIN:-$target/release/examples/offload_cycle}"
fi
MIRA_BIN="$MIRA_BIN" GEN_BIN="$GEN_BIN" python3 scripts/measure/offload_cycle.py
