#!/usr/bin/env bash
# Regenerates the chart's golden renders (tests/chart/golden/<variant>.yaml,
# one per deploy/helm/mira/ci/*-values.yaml) with MIRA_BLESS=1, or, without
# it, checks them. Review the diff before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/python-env.sh
.venv/bin/python -m pytest tests/chart/test_chart.py -q -p no:cacheprovider -k golden "$@"
