#!/usr/bin/env bash
# Ingest sweep (docs/perf.md): `mira loadgen` against `mira ingester` on the
# same machine, OTLP/gRPC, batch 8192 log records, 1/4/32/96 connections,
# WAL page-cache and fsync. Prints records/s, ack p50/p99, the ingester's
# CPU cores used and peak RSS. The ratio column is records/s against the
# DESIGN §10 target of 1 M records/s. The `4@1M` points run 4 connections
# paced at 1 M records/s (122 requests/s), the throughput target, to read
# the ack latency below saturation: a closed loop at full speed queues
# (Little's law: p50 ≈ conns × batch / records/s).
# Usage: scripts/measure/ingest-sweep.sh [seconds-per-point]
# Environment: WALS (default "page-cache fsync"), POINTS (default
# "1 4 32 96 4@1M"), INGESTER_FLAGS (extra `mira ingester` flags, e.g.
# "--max-inflight-requests 4" to read the memory bound at 96 connections),
# MIRA_BIN (the `mira` whose ingester is measured; default: build
# --release) and LOADGEN_BIN (the `mira` whose loadgen drives it; default
# MIRA_BIN), to compare two builds with the same load in one run.
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR="${1:-10}"
if [ -z "${MIRA_BIN:-}" ]; then
  cargo build --release -p mira
  MIRA_BIN="$PWD/target/release/mira"
fi
BIN="$MIRA_BIN"
LOADGEN="${LOADGEN_BIN:-$BIN}"
work=$(mktemp -d)
# Every process shares the cluster secret (docs/security.md).
MIRA_CLUSTER_SECRET_FILE=$(scripts/cluster-secret.sh "$work")
export MIRA_CLUSTER_SECRET_FILE
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks=$(getconf CLK_TCK)
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
CAT="127.0.0.1:$(port)"
"$BIN" catalog --listen "$CAT" --peers "0=$CAT" --data-dir "$work/catalog" 2>"$work/catalog.log" &
printf '%-10s %5s  %s\n' wal conns result
for wal in ${WALS:-page-cache fsync}; do
  for point in ${POINTS:-1 4 32 96 4@1M}; do
    conns=${point%@*}
    pace=()
    [ "$point" = "4@1M" ] && pace=(--rate 122)
    GRPC="127.0.0.1:$(port)"; HTTP="127.0.0.1:$(port)"
    rm -rf "$work/ingester"
    "$BIN" ingester --ingester-id "sweep-$wal-$conns" --catalog "$CAT" --grpc-listen "$GRPC" \
      --http-listen "$HTTP" --data-dir "$work/ingester" --wal "$wal" ${INGESTER_FLAGS:-} 2>"$work/ingester.log" &
    pid=$!
    for _ in $(seq 1 600); do
      curl -sf "http://$HTTP/ready" >/dev/null 2>&1 && break
      sleep 0.1
    done
    before=$(cpu_ticks "$pid")
    out=$("$LOADGEN" loadgen --target "$GRPC" --conns "$conns" --batch 8192 --for "$DUR" "${pace[@]}")
    after=$(cpu_ticks "$pid")
    rss=$(awk '/VmHWM/ { printf "%.0f MiB", $2 / 1024 }' "/proc/$pid/status")
    cores=$(awk -v a="$after" -v b="$before" -v t="$ticks" -v d="$DUR" 'BEGIN { printf "%.2f", (a - b) / t / d }')
    rate=$(echo "$out" | sed -n 's/.* \([0-9]*\) records\/s.*/\1/p')
    ratio=$(awk -v r="${rate:-0}" 'BEGIN { printf "%.2f", r / 1000000 }')
    printf '%-10s %5s  %s; ingester %s cores, peak RSS %s; ratio to 1 M/s %s\n' "$wal" "$point" "$out" "$cores" "$rss" "$ratio"
    kill -TERM "$pid"; wait "$pid" || true
  done
done
