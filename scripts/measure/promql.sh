#!/usr/bin/env bash
# PromQL against VictoriaMetrics (docs/perf.md): the same points in `mira
# serve` (release, read from published blocks) and in VictoriaMetrics
# (Debian package victoria-metrics, installed here when missing); a battery
# of range queries timed alternately, answers compared, medians and ratios
# printed. Usage: scripts/measure/promql.sh [scale] [runs]
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v victoria-metrics >/dev/null && [ ! -x /usr/bin/victoria-metrics ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y victoria-metrics
fi
cargo build --release -p mira
scripts/python-env.sh >/dev/null
MIRA_BIN="$PWD/target/release/mira" .venv/bin/python scripts/measure/promql.py "$@"
