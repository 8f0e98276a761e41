#!/usr/bin/env bash
# Crash soak (docs/perf.md, docs/operations.md): `mira loadgen` with 4
# connections into `mira ingester` behind a 3-member catalog; in each trial
# the ingester is killed (-9) at a random moment and restarted with a
# random --shards in {1, 2, 4} and a random WAL mode in {page-cache, fsync};
# every LEADER_EVERY-th trial also kills the catalog leader (-9) and
# restarts it. Each trial writes to its own tenant and must acknowledge at
# least 10,000 records. At the end the ingester is stopped (SIGTERM) and
# every acknowledged request's records are looked for in the live blocks
# themselves (`mira catalog-admin blocks` lists them, `mira block-dump`
# decodes the objects): each loadgen request carries one `loadgen-<n>`
# marker record, requests are stored whole, so a request is lost when its
# marker is missing and duplicated when it appears twice.
#
# Usage: scripts/measure/crash-soak.sh [TRIALS]   (default 20)
# Environment: MIRA_BIN (a built `mira`; default: build --release),
# LOAD_S (seconds of load per trial, 8), BATCH (records per request, 1000),
# RATE (loadgen requests/s over all connections, 0 = as fast as acked),
# LEADER_EVERY (5), SEED (for $RANDOM, default the PID).
# Prints one row per trial and `acked N, lost L, duplicated D` (records);
# exits 1 unless L and D are 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
TRIALS="${1:-${TRIALS:-20}}"
LOAD_S="${LOAD_S:-8}"
BATCH="${BATCH:-1000}"
RATE="${RATE:-0}"
LEADER_EVERY="${LEADER_EVERY:-5}"
RANDOM="${SEED:-$$}"
if [ -z "${MIRA_BIN:-}" ]; then
  cargo build --release -p mira
  MIRA_BIN="$PWD/target/release/mira"
fi
BIN="$MIRA_BIN"
work=$(mktemp -d)
# Every process shares the cluster secret (docs/security.md).
MIRA_CLUSTER_SECRET_FILE=$(scripts/cluster-secret.sh "$work")
export MIRA_CLUSTER_SECRET_FILE
cleanup() { kill -9 $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- catalog: three members
declare -a CAT CATPID
for i in 0 1 2; do CAT[$i]="127.0.0.1:$(port)"; done
PEERS="0=${CAT[0]},1=${CAT[1]},2=${CAT[2]}"
MEMBERS="${CAT[0]},${CAT[1]},${CAT[2]}"
start_member() {
  "$BIN" catalog --node-id "$1" --listen "${CAT[$1]}" --peers "$PEERS" --data-dir "$work/catalog-$1" \
    --election-timeout 500ms --heartbeat 100ms 2>>"$work/catalog-$1.log" &
  CATPID[$1]=$!
}
for i in 0 1 2; do start_member "$i"; done
leader() {
  "$BIN" catalog-admin --catalog "$MEMBERS" status 2>/dev/null | sed -n 's/.* leader \([0-9]*\) (.*/\1/p'
}

# --- ingester
GRPC="127.0.0.1:$(port)"; HTTP="127.0.0.1:$(port)"
ING_PID=""
FLAGS=""
start_ingester() {
  local shards=$((1 << (RANDOM % 3)))
  local wal; wal=$([ $((RANDOM % 2)) -eq 0 ] && echo page-cache || echo fsync)
  FLAGS="shards $shards, $wal"
  "$BIN" ingester --ingester-id soak --catalog "$MEMBERS" --grpc-listen "$GRPC" --http-listen "$HTTP" \
    --data-dir "$work/ingester" --shards "$shards" --wal "$wal" --seal-age 2s 2>>"$work/ingester.log" &
  ING_PID=$!
  for _ in $(seq 1 1200); do
    curl -sf "http://$HTTP/ready" >/dev/null 2>&1 && return 0
    kill -0 "$ING_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "the ingester did not become ready; its log:" >&2
  tail -n 30 "$work/ingester.log" >&2
  exit 1
}

start_ingester
printf '%-5s %-8s %-24s %-24s %-6s %10s %12s\n' trial kill_at before after leader acked_reqs acked_records
for t in $(seq 0 $((TRIALS - 1))); do
  before="$FLAGS"
  "$BIN" loadgen --protocol grpc --target "$GRPC" --conns 4 --batch "$BATCH" --for "$LOAD_S" --rate "$RATE" \
    --tenant "trial-$t" --acked-file "$work/acked-$t.txt" >"$work/loadgen-$t.out" 2>&1 &
  lg=$!
  kill_at=$((1 + RANDOM % (LOAD_S - 2)))
  sleep "$kill_at"
  kill -9 "$ING_PID"; wait "$ING_PID" 2>/dev/null || true
  killed_leader=no
  if [ $((t % LEADER_EVERY)) -eq $((LEADER_EVERY - 1)) ]; then
    l=$(leader)
    if [ -n "$l" ]; then
      kill -9 "${CATPID[$l]}"; wait "${CATPID[$l]}" 2>/dev/null || true
      killed_leader="$l"
      start_member "$l"
    fi
  fi
  start_ingester
  wait "$lg" || true
  reqs=$(wc -l <"$work/acked-$t.txt")
  records=$((reqs * (BATCH + 1)))
  printf '%-5s %-8s %-24s %-24s %-6s %10s %12s\n' "$t" "${kill_at}s" "$before" "$FLAGS" "$killed_leader" "$reqs" "$records"
  if [ "$records" -lt 10000 ]; then
    echo "trial $t acknowledged only $records records (need 10,000); loadgen said:" >&2
    cat "$work/loadgen-$t.out" >&2
    exit 1
  fi
done
kill -TERM "$ING_PID"; wait "$ING_PID" 2>/dev/null || true
# The ingester published everything it held; restart once more to be sure a
# recovery finds nothing left, then stop it cleanly.
start_ingester
kill -TERM "$ING_PID"; wait "$ING_PID" 2>/dev/null || true

# --- verify against the live objects
for t in $(seq 0 $((TRIALS - 1))); do
  "$BIN" catalog-admin --catalog "$MEMBERS" blocks --tenant "trial-$t" --signal logs >"$work/keys-$t.txt"
  : >"$work/dump-$t.jsonl"
  if [ -s "$work/keys-$t.txt" ]; then
    (cd "$work/ingester/objects" && xargs "$BIN" block-dump <"$work/keys-$t.txt") >"$work/dump-$t.jsonl"
  fi
done
python3 - "$work" "$TRIALS" "$BATCH" <<'EOF'
import json, sys
work, trials, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
acked_total = lost = dup = 0
for t in range(trials):
    acked = [int(l) for l in open(f"{work}/acked-{t}.txt") if l.strip()]
    seen = {}
    rows = 0
    for line in open(f"{work}/dump-{t}.jsonl"):
        req = json.loads(line)
        for rl in req.get("resourceLogs", []):
            for sl in rl.get("scopeLogs", []):
                for r in sl.get("logRecords", []):
                    rows += 1
                    body = (r.get("body") or {}).get("stringValue", "")
                    if body.startswith("loadgen-"):
                        n = int(body[len("loadgen-"):])
                        seen[n] = seen.get(n, 0) + 1
    t_lost = sum(1 for n in acked if n not in seen)
    t_dup = sum(c - 1 for c in seen.values() if c > 1)
    # Requests are stored whole: every row belongs to a request whose
    # marker is there, once per copy.
    whole = rows == sum(seen.values()) * (batch + 1)
    if not whole:
        print(f"trial {t}: {rows} rows for {sum(seen.values())} markers of {batch + 1}-record requests", file=sys.stderr)
        t_dup += 1
    acked_total += len(acked) * (batch + 1)
    lost += t_lost * (batch + 1)
    dup += t_dup * (batch + 1)
    if t_lost or t_dup:
        print(f"trial {t}: {t_lost} acknowledged requests lost, {t_dup} duplicated", file=sys.stderr)
print(f"acked {acked_total}, lost {lost}, duplicated {dup}")
sys.exit(0 if lost == 0 and dup == 0 else 1)
EOF
