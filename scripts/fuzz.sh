#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ (every parser of outside input; see
# docs/security.md#fuzzing), each for SECONDS (default 600), from a scratch
# corpus seeded with the committed one (fuzz/corpus/<target>, which a run
# never changes). Fails if any target finds a crash, a leak, a timeout
# (-timeout=10) or an input that needs more than 2 GiB (-rss_limit_mb);
# the input is kept in fuzz/artifacts/<target>/ and the run's log in
# fuzz/artifacts/<target>.log. Prints one line per target: executions,
# exec/s and the final coverage (cov/ft) and corpus size from libFuzzer's
# last stats line.
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
#        scripts/fuzz.sh --seeds [TARGET...]   rewrite the committed seed
#                                              corpora from the code
# Environment: FUZZ_NO_BUILD=1 skips the build (run targets built before);
# CARGO_LOCK=<file> builds under `flock <file>` (a machine shared by
# several builds); FUZZ_BUILD_FLAGS (default empty: release with debug
# assertions, AddressSanitizer).
#
# Needs a nightly toolchain (installed with rustup when missing) and
# cargo-fuzz (installed with `cargo install cargo-fuzz --locked` when
# missing). All targets build in one `cargo fuzz build`.
set -euo pipefail
cd "$(dirname "$0")/.."

seeds=0
if [[ "${1:-}" == "--seeds" ]]; then
  seeds=1
  shift
  secs=0
else
  secs="${1:-600}"
  [[ $# -gt 0 ]] && shift
fi
if ! [[ "$secs" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...] | --seeds [TARGET...]" >&2
  exit 2
fi

all_targets=(otlp query text block wal catalog push)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all_targets[@]}")

# Largest input per target: above its largest seed, small enough to keep
# executions fast.
max_len() {
  case "$1" in
    otlp) echo 65536 ;;
    query) echo 4096 ;;
    text) echo 8192 ;;
    block) echo 131072 ;;
    wal) echo 65536 ;;
    catalog) echo 16384 ;;
    push) echo 65536 ;;
    *) echo 65536 ;;
  esac
}

if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

lock=()
[[ -n "${CARGO_LOCK:-}" ]] && lock=(flock "$CARGO_LOCK")
if [[ "${FUZZ_NO_BUILD:-0}" != 1 ]]; then
  echo "== cargo +nightly fuzz build"
  start=$(date +%s)
  # shellcheck disable=SC2086
  "${lock[@]}" env CARGO_INCREMENTAL=0 cargo +nightly fuzz build ${FUZZ_BUILD_FLAGS:-}
  echo "built in $(($(date +%s) - start)) s"
fi
bin_dir=fuzz/target/x86_64-unknown-linux-gnu/release
[[ " ${FUZZ_BUILD_FLAGS:-} " == *" --dev "* ]] && bin_dir=fuzz/target/x86_64-unknown-linux-gnu/debug

if [[ $seeds == 1 ]]; then
  for t in "${targets[@]}"; do
    rm -rf "fuzz/corpus/$t"
    MIRA_FUZZ_WRITE_SEEDS="fuzz/corpus/$t" "$bin_dir/$t" >/dev/null 2>&1
    echo "$t: $(find "fuzz/corpus/$t" -type f | wc -l) seeds, $(du -sk "fuzz/corpus/$t" | cut -f1) KiB"
  done
  exit 0
fi

failed=()
printf '%-8s %8s %12s %8s %8s %8s %10s %s\n' target seconds execs exec/s cov ft corpus result
for t in "${targets[@]}"; do
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/mira-fuzz-$t.XXXXXX")
  mkdir -p "fuzz/artifacts/$t" "$scratch/corpus" "$scratch/tmp"
  log="fuzz/artifacts/$t.log"
  rc=0
  # New inputs go to the scratch directory (the first); the committed
  # seeds are read only.
  TMPDIR="$scratch/tmp" "$bin_dir/$t" "$scratch/corpus" "fuzz/corpus/$t" \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -max_len="$(max_len "$t")" -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1 || rc=$?
  stats=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$stats")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$stats")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$stats")
  result=ok
  if [[ $rc -ne 0 ]]; then
    result="FAILED (exit $rc, see $log)"
    failed+=("$t")
  fi
  printf '%-8s %8s %12s %8s %8s %8s %10s %s\n' "$t" "$secs" "${execs:--}" "${rate:--}" "${cov:--}" "${ft:--}" "${corp:--}" "$result"
  rm -rf "$scratch"
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzzing failed: ${failed[*]}" >&2
  for t in "${failed[@]}"; do
    grep -E -m 3 'panicked at|ERROR: libFuzzer|SUMMARY' "fuzz/artifacts/$t.log" >&2 || true
  done
  exit 1
fi
