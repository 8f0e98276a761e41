#!/usr/bin/env bash
# The test command: format check, clippy with warnings as errors, the whole
# workspace test suite, then the end-to-end tests with real OTLP clients
# (Python, in .venv, set up by scripts/python-env.sh), then a three-trial
# crash soak, then every fuzz target for a few seconds (scripts/fuzz.sh).
# Run from anywhere inside the repository. Everything but the fuzz targets
# (nightly, their own build in fuzz/target) builds once, in the debug
# profile, with the test-only fault hooks on (`mira/fault-hooks`).
set -euo pipefail
export CARGO_TERM_COLOR=never
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
FEATURES=(--features mira/fault-hooks)
cargo clippy --workspace --all-targets --locked "${FEATURES[@]}" -- -D warnings

echo "== cargo test"
# Benches are compiled by clippy above; tests run in the same debug profile
# so nothing is built twice.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked "${FEATURES[@]}" 2>&1 | tee "$log"

echo "== end-to-end (OpenTelemetry Python SDK exporters against target/debug/mira) and the Helm chart (tests/chart)"
scripts/python-env.sh
pylog=$(mktemp)
trap 'rm -f "$log" "$pylog"' EXIT
# target/debug/mira was built by `cargo test` above (the integration
# tests run it), with the same features: nothing is built twice.
MIRA_BIN="$PWD/target/debug/mira" .venv/bin/python -m pytest tests/e2e tests/chart -q -p no:cacheprovider 2>&1 | tee "$pylog"

echo "== crash soak (3 trials, one with a catalog leader kill; the full run is scripts/measure/crash-soak.sh 20)"
soaklog=$(mktemp)
trap 'rm -f "$log" "$pylog" "$soaklog"' EXIT
MIRA_BIN="$PWD/target/debug/mira" TRIALS=3 LOAD_S=6 LEADER_EVERY=3 BATCH=200 RATE=40 \
  scripts/measure/crash-soak.sh 2>&1 | tee "$soaklog"

echo "== fuzz targets (5 s each; the 10-minute runs are in docs/security.md#fuzzing)"
# A smoke run: every target builds and runs clean for a few seconds. The
# debug profile without AddressSanitizer builds in a fraction of the
# release+ASan time (overflow checks and debug assertions stay on); the
# 10-minute runs use the default (release, ASan).
FUZZ_BUILD_FLAGS="${FUZZ_BUILD_FLAGS:---dev -s none}" scripts/fuzz.sh 5

# One closing line for the whole suite (cargo prints one per test binary,
# and the last of those is a doc-test run that may hold no tests; pytest
# prints "N passed, M failed in Ts").
awk -v py="$pylog" -v soak="$soaklog" '
  FILENAME == soak && /^acked [0-9]+, lost 0, duplicated 0$/ { p += 1 }
  FILENAME != py && FILENAME != soak && /^test result:/ { p += $4; f += $6 }
  FILENAME == py && / in [0-9.]+s/ {
    for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^(failed|error)/) f += $i }
  }
  END { printf "tests: %d passed, %d failed\n", p, f }' "$log" "$pylog" "$soaklog"
