#!/usr/bin/env bash
# Per-tenant limits isolation (docs/perf.md "Per-tenant limits"): one `mira
# serve` with a limits file where tenant `b` may ingest B_LIMIT records/s
# (default 5000) and tenant `a` is unlimited. Windows alternate: "A"
# (tenant a alone, `mira loadgen` at 4 connections, OTLP/gRPC, batch 1000
# log records) and "B" (the same for a, while tenant b sends at 4
# connections as fast as it is answered, far above its limit; a refused
# request is retried after loadgen's 20 ms pause). Prints a's acknowledged
# records/s in each window, b's in each B window, and the mean ratio of a's
# rate in B windows to the A windows around it (1.00 = b at its limit does
# not slow a) and b's mean acknowledged rate against its limit.
# Usage: scripts/measure/tenant-limits.sh [seconds-per-window]
# Environment: ROUNDS (A/B pairs, default 3), B_LIMIT, MIRA_BIN (the
# `mira` measured; default: build --release).
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR="${1:-10}"
ROUNDS="${ROUNDS:-3}"
B_LIMIT="${B_LIMIT:-5000}"
if [ -z "${MIRA_BIN:-}" ]; then
  cargo build --release -p mira
  MIRA_BIN="$PWD/target/release/mira"
fi
BIN="$MIRA_BIN"
work=$(mktemp -d)
MIRA_CLUSTER_SECRET_FILE=$(scripts/cluster-secret.sh "$work")
export MIRA_CLUSTER_SECRET_FILE
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cat >"$work/limits.toml" <<TOML
[tenants.b]
ingest_records_per_second = $B_LIMIT
TOML
Q="127.0.0.1:$(port)"; HTTP="127.0.0.1:$(port)"; GRPC="127.0.0.1:$(port)"; CAT="127.0.0.1:$(port)"
"$BIN" serve --data-dir "$work/data" --listen "$Q" --http-listen "$HTTP" --grpc-listen "$GRPC" \
  --catalog-listen "$CAT" --limits-file "$work/limits.toml" 2>"$work/serve.log" &
for _ in $(seq 1 600); do
  curl -sf "http://$Q/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
load() { "$BIN" loadgen --target "$GRPC" --tenant "$1" --conns 4 --batch 1000 --for "$DUR"; }
rate() { sed -n 's/.* \([0-9]*\) records\/s.*/\1/p'; }
# A warm-up window, not counted.
load a >/dev/null
a_alone=(); a_with_b=(); b_rates=()
for r in $(seq 1 "$ROUNDS"); do
  a=$(load a | rate)
  a_alone+=("$a")
  printf 'round %d  A: a alone        %8s records/s\n' "$r" "$a"
  load b >"$work/b.out" &
  bpid=$!
  a=$(load a | rate)
  wait "$bpid"
  b=$(rate <"$work/b.out")
  a_with_b+=("$a"); b_rates+=("$b")
  printf 'round %d  B: a while b sends %8s records/s; b acknowledged %s records/s (limit %s; %s)\n' \
    "$r" "$a" "$b" "$B_LIMIT" "$(sed -n 's/.*; \([0-9]* failed attempts\)/\1/p' "$work/b.out")"
done
a_alone+=("$(load a | rate)")
printf 'closing A: a alone %s records/s\n' "${a_alone[-1]}"
python3 - "$B_LIMIT" "${a_alone[*]}" "${a_with_b[*]}" "${b_rates[*]}" <<'PY'
import sys
limit = float(sys.argv[1])
alone = [float(x) for x in sys.argv[2].split()]
with_b = [float(x) for x in sys.argv[3].split()]
b = [float(x) for x in sys.argv[4].split()]
# Each B window against the mean of the A windows before and after it.
ratios = [w / ((alone[i] + alone[i + 1]) / 2) for i, w in enumerate(with_b)]
print("ratio a(B)/a(A) per round: " + " ".join(f"{x:.2f}" for x in ratios))
print(f"mean ratio a(B)/a(A): {sum(ratios) / len(ratios):.2f}")
print(f"b acknowledged: mean {sum(b) / len(b):.0f} records/s = {sum(b) / len(b) / limit:.2f} x its limit of {limit:.0f}")
PY
