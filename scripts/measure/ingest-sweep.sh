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
# PROTOCOLS=1: instead of the sweep, the same corpus sent over each
# protocol at each point (conns), one fresh ingester per run, with the
# ratio of records/s to OTLP/HTTP on the same data: logs over OTLP/HTTP,
# OTLP/gRPC and Loki push (snappy protobuf, what the agents send); the
# corpus' gauge and sum points over OTLP/HTTP, OTLP/gRPC and remote write
# 1.0 (one sample per point; the histograms left out of every arm).
# ROUNDS (default 3) repeats the arms in turn, so drift hits all alike.
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
# One point: a fresh ingester with WAL mode $1, `mira loadgen` with the
# rest of the arguments; sets $out, $rate, $cores, $rss.
measure() {
  local wal=$1; shift
  GRPC="127.0.0.1:$(port)"; HTTP="127.0.0.1:$(port)"
  rm -rf "$work/ingester"
  runs=$(( ${runs:-0} + 1 ))
  "$BIN" ingester --ingester-id "sweep-$wal-$runs" --catalog "$CAT" --grpc-listen "$GRPC" \
    --http-listen "$HTTP" --data-dir "$work/ingester" --wal "$wal" ${INGESTER_FLAGS:-} 2>"$work/ingester.log" &
  local pid=$!
  for _ in $(seq 1 600); do
    curl -sf "http://$HTTP/ready" >/dev/null 2>&1 && break
    sleep 0.1
  done
  local args=() a
  for a in "$@"; do args+=("${a//@GRPC@/$GRPC}"); done
  args=("${args[@]//@HTTP@/$HTTP}")
  local before after
  before=$(cpu_ticks "$pid")
  out=$("$LOADGEN" loadgen "${args[@]}" --for "$DUR")
  after=$(cpu_ticks "$pid")
  rss=$(awk '/VmHWM/ { printf "%.0f MiB", $2 / 1024 }' "/proc/$pid/status")
  cores=$(awk -v a="$after" -v b="$before" -v t="$ticks" -v d="$DUR" 'BEGIN { printf "%.2f", (a - b) / t / d }')
  rate=$(echo "$out" | sed -n 's/.* \([0-9]*\) records\/s.*/\1/p')
  kill -TERM "$pid"; wait "$pid" || true
}

if [ -n "${PROTOCOLS:-}" ]; then
  printf '%-10s %5s %-22s %s\n' wal conns arm result
  for wal in ${WALS:-page-cache}; do
    for conns in ${POINTS:-4 32}; do
      declare -A sum=()
      for round in $(seq 1 "${ROUNDS:-3}"); do
        for arm in logs-otlp-http logs-otlp-grpc logs-loki-push metrics-otlp-http metrics-otlp-grpc metrics-remote-write; do
          common=(--conns "$conns" --batch 8192)
          case $arm in
            logs-otlp-http) measure "$wal" --target @HTTP@ --protocol http --signal logs "${common[@]}" ;;
            logs-otlp-grpc) measure "$wal" --target @GRPC@ --protocol grpc --signal logs "${common[@]}" ;;
            logs-loki-push) measure "$wal" --target @HTTP@ --protocol loki-push "${common[@]}" ;;
            metrics-otlp-http) measure "$wal" --target @HTTP@ --protocol http --signal metrics --numbers-only "${common[@]}" ;;
            metrics-otlp-grpc) measure "$wal" --target @GRPC@ --protocol grpc --signal metrics --numbers-only "${common[@]}" ;;
            metrics-remote-write) measure "$wal" --target @HTTP@ --protocol remote-write "${common[@]}" ;;
          esac
          sum[$arm]=$(( ${sum[$arm]:-0} + ${rate:-0} ))
          printf '%-10s %5s %-22s round %s: %s; ingester %s cores, peak RSS %s\n' "$wal" "$conns" "$arm" "$round" "$out" "$cores" "$rss"
        done
      done
      for arm in logs-otlp-http logs-otlp-grpc logs-loki-push metrics-otlp-http metrics-otlp-grpc metrics-remote-write; do
        base=${sum[${arm%%-*}-otlp-http]}
        printf '%-10s %5s %-22s mean %.0f records/s; ratio to OTLP/HTTP %s\n' "$wal" "$conns" "$arm" \
          "$(( sum[$arm] / ${ROUNDS:-3} ))" "$(awk -v a="${sum[$arm]}" -v b="$base" 'BEGIN { printf "%.2f", b ? a / b : 0 }')"
      done
      unset sum
    done
  done
  exit 0
fi

printf '%-10s %5s  %s\n' wal conns result
for wal in ${WALS:-page-cache fsync}; do
  for point in ${POINTS:-1 4 32 96 4@1M}; do
    conns=${point%@*}
    pace=()
    [ "$point" = "4@1M" ] && pace=(--rate 122)
    measure "$wal" --target @GRPC@ --conns "$conns" --batch 8192 "${pace[@]}"
    ratio=$(awk -v r="${rate:-0}" 'BEGIN { printf "%.2f", r / 1000000 }')
    printf '%-10s %5s  %s; ingester %s cores, peak RSS %s; ratio to 1 M/s %s\n' "$wal" "$point" "$out" "$cores" "$rss" "$ratio"
  done
done
